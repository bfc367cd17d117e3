"""Continuous batching of decode steps: every slot that is generating advances in one
engine call per step (`Engine.eval_batch`), which reads the weights once for all of them.

A decoding job joins the batcher (`with batcher.join(session) as member`) and submits one
step at a time (`await member.step(tokens, after)`): the tokens it has sampled but not yet
evaluated (one, or several when a tool-call constraint forces markup; none for the first
step, whose logits the prefill left) and `after`, what must run on the engine thread once
its session has them (the checkpoint hook, sampling with that job's parameters). A runner
task takes one turn of the engine gate per batch, so power pacing, the fair-prefill credit
and the one-call-at-a-time rule hold for batches as for any other call.

Gathering: once its turn has come, the runner waits until every member has submitted its
next step or every task is blocked (a member waiting for its client, or for a worker
thread, is left for the next batch). Members handle their previous token while the runner
waits for the gate, so in steady state all of them are in every batch; the wait is on the
tasks' progress, never on the clock.

Joining and leaving happen between steps. A member cancelled while its step waits leaves
at once; cancelled while its step is being computed, it waits for the engine to finish
with its session first (the slot it then frees must not change under a new owner). A
failing step fails only its own member: a batch whose evaluation fails is retried one
session at a time, and each `after` runs on its own.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from typing import TypeVar, cast, overload

import trio
import trio.testing

from ds4d.daemon.scheduler import EngineGate
from ds4d.engine.engine import Engine, Session

T = TypeVar("T")
Outcome = tuple[BaseException | None, object]  # a step's error, or what its `after` returned

log = logging.getLogger("ds4d.batcher")


class _Step:
    def __init__(
        self, member: Member, tokens: Sequence[int], after: Callable[[], object] | None
    ) -> None:
        self.member = member
        self.tokens = list(tokens)
        self.after = after
        self.taken = False  # in a batch being computed
        self.result: object = None
        self.error: BaseException | None = None
        self.done = trio.Event()

    def finish(self, error: BaseException | None, result: object = None) -> None:
        self.error, self.result = error, result
        self.done.set()


class Member:
    """One decoding job's place in the batch."""

    def __init__(self, batcher: Batcher, session: Session) -> None:
        self.batcher = batcher
        self.session = session

    @overload
    async def step(self, tokens: Sequence[int]) -> None: ...

    @overload
    async def step(self, tokens: Sequence[int], after: Callable[[], T]) -> T: ...

    async def step(self, tokens: Sequence[int], after: Callable[[], T] | None = None) -> T | None:
        """Evaluates `tokens` on this member's session in the next batch, then runs
        `after` (on the engine thread); returns what `after` returned."""
        # what `after` returned, carried through the batch as an object
        return cast("T | None", await self.batcher._submit(self, tokens, after))


class Batcher:
    def __init__(
        self, engine: Engine, gate: EngineGate, on_batch: Callable[[int], None] | None = None
    ) -> None:
        self.engine = engine
        self.gate = gate
        self.on_batch = on_batch  # the size of each batch computed (metrics)
        self._members: dict[Member, None] = {}  # joined, in order of joining
        self._queued: dict[Member, _Step] = {}  # steps for the next batch
        self._running = False  # a runner task exists
        self._gathering: trio.CancelScope | None = None
        self._resting: trio.CancelScope | None = None

    @property
    def members(self) -> int:
        return len(self._members)

    @contextmanager
    def join(self, session: Session) -> Iterator[Member]:
        if any(m.session is session for m in self._members):
            raise RuntimeError("this session is already decoding in the batch")
        member = Member(self, session)
        self._members[member] = None
        try:
            yield member
        except BaseException:
            if len(self._members) == 1 and self._resting is not None:
                # The last member was cancelled (its client went away, shutdown) while
                # the engine rests for the batch: as for any cancelled request, the
                # engine is free at once. A member that finishes pays its rest.
                self._resting.cancel()
            raise
        finally:
            del self._members[member]
            self._changed()

    # -- the member side ------------------------------------------------------------------

    async def _submit(
        self, member: Member, tokens: Sequence[int], after: Callable[[], object] | None
    ) -> object:
        if member not in self._members:
            raise RuntimeError("a step of a member that has left the batch")
        if member in self._queued:
            raise RuntimeError("a member submits one step at a time")
        step = _Step(member, tokens, after)
        self._queued[member] = step
        self._changed()
        if not self._running:
            self._running = True
            trio.lowlevel.spawn_system_task(self._run)
        try:
            await step.done.wait()
        except BaseException:
            if not step.taken:
                if self._queued.get(member) is step:
                    del self._queued[member]
                    self._changed()
                raise
            with trio.CancelScope(shield=True):
                await step.done.wait()
            raise
        if step.error is not None:
            raise step.error
        return step.result

    def _complete(self) -> bool:
        return len(self._queued) >= len(self._members)

    def _changed(self) -> None:
        if self._gathering is not None and self._complete():
            self._gathering.cancel()

    # -- the runner -----------------------------------------------------------------------

    async def _run(self) -> None:
        try:
            while self._queued:
                await self._batch()
        except BaseException as e:
            if not isinstance(e, trio.Cancelled):
                log.exception("decode batcher failed")
            for step in self._queued.values():
                step.finish(RuntimeError("the decode batcher stopped"))
            self._queued.clear()
            if not isinstance(e, Exception):
                raise
        finally:
            self._running = False

    async def _batch(self) -> None:
        async with self.gate.hold() as engine:
            await self._gather()
            steps = list(self._queued.values())
            self._queued.clear()
            if not steps:  # every member left while waiting for the gate
                return
            for step in steps:
                step.taken = True
            outcomes: list[Outcome] | None = None
            try:
                outcomes = await engine.work(self._compute, steps)
            finally:
                if outcomes is None:  # the runner itself failed: no step may hang
                    outcomes = [(RuntimeError("the decode batch failed"), None) for _ in steps]
                for step, (error, result) in zip(steps, outcomes, strict=True):
                    step.finish(error, result)
            if self.on_batch is not None:
                self.on_batch(len(steps))
            with trio.CancelScope() as self._resting:
                await engine.rest()
            self._resting = None

    async def _gather(self) -> None:
        """Until every member has its next step queued, or every task is blocked."""
        if self._complete():
            return
        with trio.CancelScope() as self._gathering:
            await trio.testing.wait_all_tasks_blocked()
        self._gathering = None

    def _compute(self, steps: list[_Step]) -> list[Outcome]:
        """On the engine thread: one evaluation for every step, then each one's `after`."""
        errors: dict[int, BaseException] = {}
        evals = [(i, s) for i, s in enumerate(steps) if s.tokens]
        if evals:
            before = [s.member.session.n_tokens for _, s in evals]
            try:
                self.engine.eval_batch([(s.member.session, s.tokens) for _, s in evals])
            except Exception:
                # One session's bad step (context full, a bad token) must not fail the
                # others: each session not yet advanced is evaluated on its own.
                for (i, step), n in zip(evals, before, strict=True):
                    session = step.member.session
                    if session.n_tokens == n + len(step.tokens):
                        continue
                    try:
                        if session.n_tokens != n:
                            raise RuntimeError("a decode step was partly evaluated")
                        self.engine.eval_batch([(session, step.tokens)])
                    except Exception as e:
                        errors[i] = e
        outcomes: list[Outcome] = []
        for i, step in enumerate(steps):
            if i in errors:
                outcomes.append((errors[i], None))
                continue
            try:
                outcomes.append((None, step.after() if step.after is not None else None))
            except Exception as e:
                outcomes.append((e, None))
        return outcomes
