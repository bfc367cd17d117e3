"""The engine loop of one model: one task owns the engine and every request's progress.

Each request is a small state machine the loop drives:

    queued --(a slot of its class is idle)--> planning --(matching plan made)--> prefill
      --(the slot's session holds the prompt)--> decode --(finish)--> done

Each step of the loop is one turn of the compute gate (ds4d.serving.gate) and one call on
a worker thread (the event loop never waits on the engine):

- one batched decode (`Engine.eval_batch`) of every decoding request's pending tokens,
  then each one's next token sampled and turned into events (ds4d.serving.decoding);
- plus at most one prefill call (a chunk of one C call sized by engine time:
  ds4d.serving.chunking, or a rewind, a disk load, a checkpoint: ds4d.state.sync) of the
  request first in priority order: "completion" before "chat" before "background", and
  round robin within a priority (a request whose prompt is all in goes first: its first
  token does not wait for another prompt's chunk); when no request has one, a chunk of a
  decoding request's draft-model session catching up with its slot (a new prompt:
  ds4d.serving.draft), under the same budget, so a draft model's prompt is not evaluated
  inside a decode step.

Fairness: a prefill chunk earns the decoding requests as much engine time as it took
(its credit); while that lasts, steps decode only, so a generating request gets a burst
of tokens between two chunks of another's long prefill, not one token per chunk, and the
prefill still gets about half the engine. A prompt prefilled in one call (a short
request, a conversation's next turn) and a completion-priority request's chunks do not
wait for the credit: they go in the next step.

Results go to per-request channels (unbounded: the loop never waits for a reader).
Requests come and go as messages (`submit`, `cancel`), applied between steps: a
cancellation takes effect at the next step, and a request's slot is never changed while a
step computes on it. A newer request with the same `supersede_key` cancels the older one.
Blocking work outside the engine (the matching plan, the trace line) runs in tasks of the
loop's own nursery, whose lifetime is the loop's.

Steering (docs/steering.md): a request runs under its own steering if it chose one, else
under the model's current one as it is when the request is submitted (`set_steering`
changes it for the requests submitted after: those already queued or generating keep
theirs). A slot's session takes the request's steering while the request is planned, when
the slot is the request's and no step computes on it; a session whose steering changes
drops its KV (saved to disk first when the disk cache holds its steering).
"""

from __future__ import annotations

import enum
import logging
import math
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Protocol

import numpy as np
import trio

from ds4d.chat.errors import Overloaded
from ds4d.chat.types import Event, Finish, Priority, Usage
from ds4d.engine.engine import Engine, Session
from ds4d.engine.sampler import sample
from ds4d.engine.steering import Steering
from ds4d.serving.chunking import ChunkSizer
from ds4d.serving.decoding import DecodeStep, Decoding
from ds4d.serving.draft import DraftModel
from ds4d.serving.gate import ComputeGate
from ds4d.serving.prompt import Prepared
from ds4d.serving.slots import SlotPool
from ds4d.serving.speculation import accept
from ds4d.serving.stepcost import StepCost
from ds4d.state.kvstate import KVState
from ds4d.state.matching import Plan
from ds4d.state.recent import Route
from ds4d.state.service import tool_call_ids
from ds4d.state.slots import Slot
from ds4d.state.sync import (
    EngineCall,
    EngineCalls,
    EvalChunk,
    KVCalls,
    SlotSync,
    plan_with_recent,
    run_call,
    steer_session,
)

log = logging.getLogger("ds4d.loop")

RANK: dict[Priority, int] = {"completion": 0, "chat": 1, "background": 2}
RETRY_AFTER_S = 2
FAILED = "generation failed (details are in the server log)"


class Phase(enum.Enum):
    QUEUED = "queued"
    PLANNING = "planning"
    PREFILL = "prefill"
    DECODE = "decode"
    DONE = "done"


@dataclass(eq=False)
class Work:
    """One request in the loop."""

    prepared: Prepared
    send: trio.MemorySendChannel[Event]
    seq: int  # arrival order
    steering: Steering | None = None  # what its slot's session runs it under
    phase: Phase = Phase.QUEUED
    slot: Slot | None = None
    sync: SlotSync | None = None
    decoding: Decoding | None = None
    served: int = 0  # the step of its last prefill call (round robin)
    cancelled: bool = False  # a cancellation is on its way
    superseded: bool = False
    prefill_t0: float = 0.0
    decode_t0: float = 0.0

    @property
    def priority(self) -> Priority:
        return self.prepared.request.priority

    @property
    def prompt_in(self) -> bool:
        """Its prompt's chunks are all evaluated and what is left is no chunk. A request
        whose draft model's session is still catching up (`decoding` set) has chunks left:
        it takes its turn in the round robin."""
        s = self.sync
        return self.decoding is None and s is not None and s.evaluating and s.remaining() == 0


class LoopHooks(Protocol):
    """What the loop reports and asks of the model it serves (ds4d.serving.model)."""

    def decoding(self, prepared: Prepared, session: Session, room: int) -> Decoding:
        """The decode of a request whose prompt the session now holds."""
        ...

    def prefill_chunk(self) -> None: ...

    def decode_batch(self, size: int) -> None: ...

    def finished(self, prepared: Prepared, slot: Slot) -> None:
        """A request that had a slot is over (its record complete): log it, count it."""
        ...

    def trace(self, prepared: Prepared) -> None:
        """The trace line of a request that had a slot (blocking: a file write)."""
        ...

    def dropped(self, prepared: Prepared) -> None:
        """A request that never had a slot is over (cancelled or superseded in the queue)."""
        ...


@dataclass(frozen=True)
class DraftCatchUp:
    """Prefill work for a decoding request's draft session: evaluate up to `n` of the
    tokens of its slot's session that it lacks (ds4d.serving.draft.DraftModel.catch_up)."""

    model: DraftModel
    n: int


PrefillCall = EngineCall | DraftCatchUp


@dataclass
class _Outcome:
    """What a step's worker call did, for the loop to hand out."""

    events: dict[Work, list[Event]] = field(default_factory=dict)
    finished: dict[Work, Finish] = field(default_factory=dict)
    failed: dict[Work, BaseException] = field(default_factory=dict)
    decode_s: float = 0.0
    prefill_s: float = 0.0


class EngineLoop:
    def __init__(
        self,
        engine: Engine,
        pool: SlotPool,
        gate: ComputeGate,
        hooks: LoopHooks,
        *,
        kv: KVState | None = None,
        calls: EngineCalls | None = None,
        sizer: ChunkSizer | None = None,
        cost: StepCost | None = None,
        queue_size: int = 16,
        clock: Callable[[], float] = time.perf_counter,
    ) -> None:
        """`cost` is told what plain steps of a lone session and verification chunks
        take (speculation's draft length follows it: ds4d.serving.stepcost)."""
        self.engine = engine
        self.pool = pool
        self.gate = gate
        self.hooks = hooks
        self.kv = kv
        self.calls = calls if calls is not None else KVCalls(kv)
        self.sizer = sizer if sizer is not None else ChunkSizer()
        self.cost = cost
        self.queue_size = queue_size
        self.clock = clock  # times engine work (chunk sizes, the decode credit)
        self._inbox: list[tuple[str, Work]] = []
        self._queue: list[Work] = []  # waiting for a slot
        self._active: list[Work] = []  # planning, prefill, decode
        self._keys: dict[str, Work] = {}  # supersede_key -> the live request holding it
        self._seq = 0
        self._steps = 0
        self._credit = 0.0  # engine seconds decode steps may take before the next chunk
        self._wake = trio.Event()
        self._resting: trio.CancelScope | None = None
        self._nursery: trio.Nursery | None = None
        # the steering of requests that do not choose their own (set_steering)
        self.current_steering: Steering | None = engine.steering

    # -- messages (from request tasks, on the trio thread) ---------------------------------

    @property
    def waiting(self) -> int:
        return len(self._queue) + sum(kind == "submit" for kind, _ in self._inbox)

    def admit(self, priority: Priority) -> None:
        """Overloaded when a request of this priority would find its slot class busy and
        the queue full (a 503 with Retry-After)."""
        if self.waiting >= self.pool.idle(priority) + self.queue_size:
            raise Overloaded("all slots are busy and the queue is full; retry later", RETRY_AFTER_S)

    def submit(self, prepared: Prepared) -> tuple[Work, trio.MemoryReceiveChannel[Event]]:
        """Queue a request: its events come on the returned channel, the first one its
        prompt's usage as tokenized (a stream can open at once however long the queue and
        the prefill take). Overloaded when its slot class and the queue are full."""
        self.admit(prepared.request.priority)
        send, recv = trio.open_memory_channel[Event](math.inf)
        send.send_nowait(Usage(len(prepared.tokens), 0))
        self._seq += 1
        steering = prepared.steering if prepared.steered else self.current_steering
        work = Work(prepared, send, self._seq, steering)
        key = prepared.request.supersede_key
        if key is not None:
            older = self._keys.get(key)
            if older is not None:
                older.superseded = True
                self.cancel(older)
            self._keys[key] = work
        self._inbox.append(("submit", work))
        self._wake.set()
        return work, recv

    def set_steering(self, steering: Steering | None) -> None:
        """The steering of the requests submitted from now on that do not choose their
        own (None: unsteered). Those already submitted keep the one they were submitted
        under; no session changes here (see the module doc)."""
        self.current_steering = steering

    def cancel(self, work: Work) -> None:
        """The request is no longer wanted (its client went away, it was superseded): it
        ends at the next step."""
        if work.phase == Phase.DONE or work.cancelled:
            return
        work.cancelled = True
        self._inbox.append(("cancel", work))
        self._wake.set()
        live = [w for w in self._active if not w.cancelled]
        if self._resting is not None and not live:
            # the last request went away while the engine rests for its step: as for any
            # cancelled request, the engine is free at once
            self._resting.cancel()

    # -- the loop --------------------------------------------------------------------------

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        async with trio.open_nursery() as nursery:
            self._nursery = nursery
            task_status.started()
            try:
                while True:
                    self._wake = trio.Event()
                    self._apply_messages()
                    self._assign_slots()
                    decodes, prefill = self._plan_step()
                    if not decodes and prefill is None:
                        await self._wake.wait()
                        continue
                    await self._step(decodes, prefill)
            finally:
                with trio.CancelScope(shield=True):
                    for work in list(self._active) + list(self._queue):
                        self._finalize(work, None)

    def _apply_messages(self) -> None:
        inbox, self._inbox = self._inbox, []
        for kind, work in inbox:
            if kind == "submit":
                if work.cancelled:
                    self._finalize(work, None)
                else:
                    self._queue.append(work)
                continue
            if work.phase == Phase.PLANNING:
                continue  # ends when its plan is made (the plan reads its session)
            if work.phase != Phase.DONE:
                self._finalize(work, None)

    def _assign_slots(self) -> None:
        for work in sorted(self._queue, key=lambda w: (RANK[w.priority], w.seq)):
            key = work.steering.key if work.steering is not None else ""
            slot = self.pool.take(work.prepared.tokens, work.priority, key)
            if slot is None:
                continue
            self._queue.remove(work)
            work.slot = slot
            work.prepared.record.slot = slot.index
            work.phase = Phase.PLANNING
            self._active.append(work)
            assert self._nursery is not None
            self._nursery.start_soon(self._plan, work)

    async def _plan(self, work: Work) -> None:
        """The matching plan, on a worker outside the engine: the slot is the request's,
        so its session holds still while it takes the request's steering and the plan
        reads it."""
        assert work.slot is not None
        p = work.prepared
        session = work.slot.session
        work.prefill_t0 = time.perf_counter()
        try:
            # an editor's completion keeps any shared prefix (kv-cache-min-tokens is for
            # agents' conversations): every token it re-reads is a keystroke's wait
            completion = p.request.priority == "completion"
            recent = work.slot.recent if completion else None

            def plan() -> tuple[Plan, Route | None]:
                steer_session(session, work.steering, self.kv)
                return plan_with_recent(self.kv, session, p.text, p.tokens, recent,
                                        1 if completion else None)  # fmt: skip

            plan_made, route = await trio.to_thread.run_sync(plan)
        except Exception:
            log.exception("matching plan failed")
            self._fail(work)
            self._wake.set()
            return
        if work.cancelled:
            self._finalize(work, None)
        else:
            work.sync = SlotSync(session, p.text, p.tokens, plan_made, self.kv,
                                 tool_call_ids(p.request), recent, route)  # fmt: skip
            work.phase = Phase.PREFILL
        self._wake.set()

    def _plan_step(self) -> tuple[list[tuple[Work, DecodeStep]], tuple[Work, PrefillCall] | None]:
        decodes = []
        for w in self._active:
            if w.phase == Phase.DECODE:
                assert w.decoding is not None
                decodes.append((w, w.decoding.step()))
        prefill: tuple[Work, PrefillCall] | None = None
        if any(w.phase == Phase.PLANNING for w in self._active):
            # A request that just got its slot is planned (on a worker, in a moment)
            # before the next prefill call is picked: it takes its turn in the round, not
            # one chunk later.
            return decodes, None
        # Round robin within a priority, except that a request whose chunks are all in
        # goes first: what it has left (a save at a stop, keeping its state, the switch to
        # decoding) is no chunk, and its first token should not wait for another prompt's.
        waiting = sorted((w for w in self._active if w.phase == Phase.PREFILL),
                         key=lambda w: (RANK[w.priority], not w.prompt_in, w.served, w.seq))  # fmt: skip
        for w in waiting:
            sync = w.sync
            assert sync is not None and w.slot is not None
            if w.decoding is not None:  # the prompt is in; its draft session's is coming
                catch_up = self._draft_catch_up(w)
                if catch_up is None:
                    self._begin_decode(w)
                    decodes.append((w, w.decoding.step()))
                    continue
                if decodes and self._credit > 0 and w.priority != "completion":
                    continue
                prefill = (w, catch_up)
                break
            depth = w.slot.session.n_tokens
            size = self.sizer.size(depth, sync.remaining())
            whole = sync.prefilling and not sync.evaluating and sync.remaining() <= size
            if decodes and self._credit > 0 and not whole and w.priority != "completion":
                continue
            call = sync.next(size)
            if call is None:
                self._start_decoding(w)
                if w.phase == Phase.DECODE:
                    assert w.decoding is not None
                    decodes.append((w, w.decoding.step()))
                    continue
                if w.phase != Phase.PREFILL:  # nothing to generate: it ended
                    continue
                catch_up = self._draft_catch_up(w)  # its draft session's prompt, next
                if catch_up is not None and not (decodes and self._credit > 0):
                    prefill = (w, catch_up)
                    break
                continue
            prefill = (w, call)
            break
        if prefill is None and not (decodes and self._credit > 0):
            for w in sorted((w for w in self._active if w.phase == Phase.DECODE),
                            key=lambda w: (RANK[w.priority], w.served, w.seq)):  # fmt: skip
                catch_up = self._draft_catch_up(w)
                if catch_up is not None:
                    prefill = (w, catch_up)
                    break
        return decodes, prefill

    def _draft_catch_up(self, work: Work) -> DraftCatchUp | None:
        """A chunk of catching up for the request's draft session, when it lacks more of
        its slot's tokens than a drafting step evaluates and its draft model would draft
        (Speculation.model_catch_up); sessions change only on the engine thread, between
        these plans."""
        spec = work.decoding.speculation if work.decoding is not None else None
        if spec is None or spec.model is None:
            return None
        behind = spec.model_catch_up(self._session(work))
        if behind <= 0:
            return None
        depth = self._session(work).n_tokens - behind
        return DraftCatchUp(spec.model, self.sizer.size(depth, behind))

    def _start_decoding(self, work: Work) -> None:
        sync, slot = work.sync, work.slot
        assert sync is not None and slot is not None
        r = sync.result()
        rec = work.prepared.record
        now = time.perf_counter()
        rec.prefill_s = now - work.prefill_t0
        rec.prompt_tokens = len(r.tokens)
        rec.cached_tokens = r.cached_tokens
        rec.cache_source = r.source
        rec.prefilled_tokens = len(r.tokens) - r.cached_tokens
        rec.miss_reason = r.plan.miss_reason
        rec.disk_file = r.disk_file
        work.decode_t0 = now
        self._send(work, [Usage(len(r.tokens), 0, r.cached_tokens, r.source)])
        room = slot.ctx - slot.session.n_tokens - 1
        work.decoding = self.hooks.decoding(work.prepared, slot.session, room)
        if work.decoding.done:  # nothing to generate (max_tokens 0)
            work.phase = Phase.DECODE
            events, finish = work.decoding.finish()
            self._end(work, events, finish)
        elif self._draft_catch_up(work) is None:
            work.phase = Phase.DECODE
        # else its draft model's session evaluates the prompt first, as prefill work (the
        # request stays in PREFILL; decode time begins after it)

    def _begin_decode(self, work: Work) -> None:
        """A request whose draft session caught up with its prompt starts to decode."""
        now = time.perf_counter()
        work.prepared.record.prefill_s = now - work.prefill_t0
        work.decode_t0 = now
        work.phase = Phase.DECODE

    async def _step(
        self, decodes: list[tuple[Work, DecodeStep]], prefill: tuple[Work, PrefillCall] | None
    ) -> None:
        self._steps += 1
        whole = False
        depth = 0
        if prefill is not None:
            w, call = prefill
            assert w.sync is not None and w.slot is not None
            w.served = self._steps
            depth = w.slot.session.n_tokens
            whole = (
                isinstance(call, EvalChunk)
                and w.sync.cached_at_eval == depth
                and (len(call.tokens) >= w.sync.remaining())
            )
        async with self.gate.turn():
            out = await trio.to_thread.run_sync(self._compute, decodes, prefill)
            # Prefill work earns the decode steps its time (a short prompt's only chunk
            # does not: it went as a decode step would); decode steps spend it.
            if prefill is not None and not whole:
                self._credit = max(self._credit, out.prefill_s)
            else:
                self._credit -= out.prefill_s
            self._credit = max(0.0, self._credit - out.decode_s)
            if prefill is not None:
                w, call = prefill
                if isinstance(call, EvalChunk) and w not in out.failed:
                    self.sizer.observe(depth, len(call.tokens), out.prefill_s)
                    self.hooks.prefill_chunk()
            if decodes:
                self.hooks.decode_batch(len(decodes))
            self._hand_out(out)
            with trio.CancelScope() as self._resting:
                await self.gate.rest(out.decode_s + out.prefill_s)
            self._resting = None

    def _hand_out(self, out: _Outcome) -> None:
        for work, error in out.failed.items():
            log.error("generation failed", exc_info=error)
            self._fail(work)
        for work, events in out.events.items():
            finish = out.finished.get(work)
            if finish is not None:
                self._end(work, events, finish)
            else:
                self._send(work, events)

    def _compute(
        self, decodes: list[tuple[Work, DecodeStep]], prefill: tuple[Work, PrefillCall] | None
    ) -> _Outcome:
        """On the engine's thread: the step's batched decode, then its prefill call."""
        out = _Outcome()
        start = self.clock()
        if decodes:
            self._decode(decodes, out)
        mid = self.clock()
        if prefill is not None:
            work, call = prefill
            assert work.sync is not None and work.slot is not None
            try:
                if isinstance(call, DraftCatchUp):
                    t0 = self.clock()
                    n = call.model.catch_up(work.slot.session, call.n)
                    if self.cost is not None:
                        self.cost.observe_catch_up(n, self.clock() - t0)
                else:
                    work.sync.took(call, run_call(self.calls, work.slot.session, call))
            except Exception as e:
                out.failed[work] = e
        out.decode_s, out.prefill_s = mid - start, self.clock() - mid
        return out

    def _decode(self, decodes: list[tuple[Work, DecodeStep]], out: _Outcome) -> None:
        # Every decoding request's pending tokens go in one batched call; a request with
        # drafts adds them and gets the logits of its chunk's every row (its verification,
        # ds4n_dec_model_eval_rows: the weights are read once per step for all of them).
        drafts = {w: d for w, s in decodes if (d := self._draft(w, s))}
        evals = [(w, s) for w, s in decodes if s.tokens]
        chunks = {w: s.tokens + drafts.get(w, []) for w, s in evals}
        want = {w: len(chunks[w]) if w in drafts else 1 for w, _ in evals}
        rows: dict[Work, np.ndarray] = {}
        if evals:
            before = [self._session(w).n_tokens for w, _ in evals]
            try:
                t0 = self.clock()
                got = self.engine.eval_batch([(self._session(w), chunks[w]) for w, _ in evals],
                                             [want[w] for w, _ in evals])  # fmt: skip
                lone = evals[0][0]
                if self.cost is not None and len(evals) == 1 and want[lone] == len(chunks[lone]):
                    # a lone plain step (n = 1) or verification chunk
                    self.cost.observe_chunk(want[lone], self.clock() - t0)
                rows = {w: r for (w, _), r in zip(evals, got, strict=True)}
            except Exception:
                # One session's bad step (context full, a bad token) must not fail the
                # others: each session not yet advanced is evaluated on its own (a
                # verification that was, again: its rows are needed).
                for (w, _), n in zip(evals, before, strict=True):
                    session = self._session(w)
                    chunk = chunks[w]
                    if session.n_tokens == n + len(chunk) and w not in drafts:
                        continue
                    try:
                        if session.n_tokens not in (n, n + len(chunk)):
                            raise RuntimeError("a decode step was partly evaluated")
                        session.rewind(n)
                        rows[w] = self.engine.eval_batch([(session, chunk)], [want[w]])[0]
                    except Exception as e:
                        out.failed[w] = e
        for w, s in decodes:
            if w in out.failed:
                continue
            decoding = w.decoding
            assert decoding is not None
            try:
                spec = decoding.speculation
                session = self._session(w)
                if w in drafts:
                    assert spec is not None
                    chunk = chunks[w]
                    n0 = session.n_tokens - len(chunk)
                    verified = accept(decoding, s, chunk, rows[w], spec.draw())
                    session.rewind(n0 + verified.keep)
                    spec.observe(verified.drafted, verified.accepted)
                    decoding.record.drafted_tokens += verified.drafted
                    decoding.record.accepted_tokens += verified.accepted
                    if self.kv is not None:
                        self.kv.after_token(session)  # the session holds accepted tokens only
                    events = verified.events
                else:
                    token = None
                    if s.sample:
                        if s.tokens and self.kv is not None:
                            self.kv.after_token(session)  # a continued checkpoint at a frontier
                        token = sample(session.compute_logits(), s.params, decoding.rng, s.allowed)
                        if spec is not None:
                            spec.observe(0, 0)
                    events = decoding.after(token)
                if decoding.done:
                    decoding.drop_undelivered()
                    more, out.finished[w] = decoding.finish()
                    events += more
                out.events[w] = events
            except Exception as e:
                out.failed[w] = e

    def _draft(self, work: Work, step: DecodeStep) -> list[int]:
        """The tokens a speculating request drafts after its pending one (engine thread):
        never more than it may still generate, than its context holds, nor past the next
        continued checkpoint (only accepted tokens are ever saved, at the same lengths)."""
        decoding = work.decoding
        assert decoding is not None
        if decoding.speculation is None or not step.sample or len(step.tokens) != 1:
            return []
        session = self._session(work)
        after = session.n_tokens + 1  # with the pending token
        limit = min(decoding.budget - decoding.generated, session.n_ctx - after)
        frontier = self.kv.next_frontier(session) if self.kv is not None else None
        if frontier is not None:
            limit = min(limit, frontier - after)
        draft = decoding.speculation.draft(decoding, step, int(limit))
        if draft and step.allowed is not None and not (step.allowed == draft[0]).any():
            return []  # the constraint cuts the draft at its first token (later ones are
            # checked as they are sampled: a token it does not allow is never drawn)
        return draft

    def _session(self, work: Work) -> Session:
        assert work.slot is not None
        return work.slot.session

    # -- the end of a request --------------------------------------------------------------

    def _send(self, work: Work, events: list[Event]) -> None:
        try:
            for ev in events:
                work.send.send_nowait(ev)
        except (trio.BrokenResourceError, trio.ClosedResourceError):
            self.cancel(work)  # nobody reads it any more

    def _end(self, work: Work, events: list[Event], finish: Finish) -> None:
        rec = work.prepared.record
        rec.decode_s = time.perf_counter() - work.decode_t0
        decoding = work.decoding
        assert decoding is not None
        rec.generated_tokens = decoding.generated
        usage = Usage(rec.prompt_tokens, decoding.generated, rec.cached_tokens, rec.cache_source)
        self._send(work, [*events, usage, finish])
        self._finalize(work, finish)

    def _fail(self, work: Work) -> None:
        finish = Finish("error", FAILED)
        self._send(work, [finish])
        self._finalize(work, finish)

    def _finalize(self, work: Work, finish: Finish | None) -> None:
        """The request is over (`finish` None: cancelled): its slot is released, its
        record completed and reported; its channel closes once the trace line is
        written (a client that sees the end finds it)."""
        if work.phase == Phase.DONE:
            return
        phase = work.phase
        work.phase = Phase.DONE
        if work in self._queue:
            self._queue.remove(work)
        if work in self._active:
            self._active.remove(work)
        key = work.prepared.request.supersede_key
        if key is not None and self._keys.get(key) is work:
            del self._keys[key]
        if finish is None and work.superseded:
            try:
                work.send.send_nowait(Finish("error", "superseded by a newer request"))
            except (trio.BrokenResourceError, trio.ClosedResourceError):
                pass
        slot = work.slot
        if slot is None:  # never had a slot: nothing to trace
            self.hooks.dropped(work.prepared)
            work.send.close()
            return
        rec = work.prepared.record
        if finish is None:
            sync = work.sync
            if phase in (Phase.PLANNING, Phase.PREFILL):
                rec.prefill_s = time.perf_counter() - work.prefill_t0
                if sync is not None and sync.evaluating:
                    rec.cached_tokens = sync.cached_at_eval
                    rec.prefilled_tokens = max(0, slot.session.n_tokens - rec.cached_tokens)
                else:
                    rec.cached_tokens = 0
            elif phase == Phase.DECODE:
                rec.decode_s = time.perf_counter() - work.decode_t0
        rec.finish = finish.reason if finish is not None else "cancelled"
        self.pool.release(slot)
        self.hooks.finished(work.prepared, slot)
        if self._nursery is None:
            work.send.close()
            return
        self._nursery.start_soon(self._report, work)
        self._wake.set()  # its slot may go to a waiting request

    async def _report(self, work: Work) -> None:
        # A file write, off the loop; shielded: a cancelled request is traced too.
        with trio.CancelScope(shield=True):
            try:
                await trio.to_thread.run_sync(self.hooks.trace, work.prepared)
            except Exception:  # a trace failure must never break serving
                log.exception("writing the trace line failed")
            finally:
                work.send.close()
