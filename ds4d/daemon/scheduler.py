"""Slot assignment: longest shared token prefix, else least recently used, else a fair
bounded queue; and the engine gate every engine call goes through."""

from __future__ import annotations

import time
from collections import deque
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from contextlib import asynccontextmanager
from typing import TypeVar

import trio
import trio.testing

from ds4d.chat.errors import Overloaded
from ds4d.state.matching import common_prefix
from ds4d.state.slots import Slot

T = TypeVar("T")

RETRY_AFTER_S = 2


class Ticket:
    """A request's place in line: holds its slot at once, or waits its turn (FIFO)."""

    def __init__(self, pool: SlotPool, slot: Slot | None) -> None:
        self.pool = pool
        self.slot = slot
        self._ready = trio.Event()
        if slot is not None:
            self._ready.set()

    def _grant(self, slot: Slot) -> None:
        self.slot = slot
        self._ready.set()

    async def wait(self) -> Slot:
        """The slot, once it is this request's turn. Cancelled while waiting, the
        ticket leaves the line (or hands on a slot granted in the meantime)."""
        try:
            await self._ready.wait()
        except BaseException:
            self.cancel()
            raise
        assert self.slot is not None
        return self.slot

    def cancel(self) -> None:
        """Give up the place in line, or the slot if one was granted but never used."""
        if self.slot is not None:
            slot, self.slot = self.slot, None
            self.pool.release(slot)
        elif self in self.pool._waiters:
            self.pool._waiters.remove(self)


class SlotPool:
    def __init__(self, slots: list[Slot], queue_size: int) -> None:
        self.slots = slots
        self.queue_size = queue_size
        self._waiters: deque[Ticket] = deque()

    @property
    def busy(self) -> int:
        return sum(s.busy for s in self.slots)

    @property
    def waiting(self) -> int:
        return len(self._waiters)

    def best_idle(self, prompt: Sequence[int]) -> Slot | None:
        idle = [s for s in self.slots if not s.busy]
        if not idle:
            return None
        shared = [(common_prefix(s.tokens, prompt), s) for s in idle]
        best_len, best = max(shared, key=lambda p: p[0])
        # Every prompt of a chat template shares its fixed preamble with every slot, so a
        # short shared head would send unrelated conversations onto one slot, destroying
        # each other's state while other slots sit idle. Reuse a slot only when the match
        # keeps at least half of what it holds; else take the least recently used one.
        if best_len > 0 and 2 * best_len >= len(best.tokens):
            return best
        return min(idle, key=lambda s: s.last_used)

    def request(self, prompt: Sequence[int]) -> Ticket:
        """A place for this prompt, decided at once: a slot if one is idle (the one
        sharing most with the prompt, else the least recently used), else a place in the
        queue behind the requests already waiting. A full queue is refused (Overloaded:
        503 with Retry-After)."""
        if not self._waiters:
            slot = self.best_idle(prompt)
            if slot is not None:
                return Ticket(self, self._take(slot))
        if len(self._waiters) >= self.queue_size:
            raise Overloaded("all slots are busy and the queue is full; retry later", RETRY_AFTER_S)
        ticket = Ticket(self, None)
        self._waiters.append(ticket)
        return ticket

    def _take(self, slot: Slot) -> Slot:
        slot.busy = True
        slot.requests += 1
        return slot

    def release(self, slot: Slot) -> None:
        slot.last_used = time.monotonic()
        slot.busy = False
        if self._waiters:
            self._waiters.popleft()._grant(self._take(slot))


class _Turn:
    """One engine call waiting for the gate."""

    def __init__(self, bulk: bool) -> None:
        self.bulk = bulk
        self.granted = False
        self.event = trio.Event()


class Held:
    """One turn of the engine gate (see EngineGate.hold)."""

    def __init__(self, gate: EngineGate, bulk: bool) -> None:
        self.gate = gate
        self.bulk = bulk
        self.work_s = 0.0  # engine time taken during this turn

    async def work(self, fn: Callable[..., T], *args: object) -> T:
        gate = self.gate
        start = gate.clock()
        result = await trio.to_thread.run_sync(fn, *args)
        work = gate.clock() - start
        self.work_s += work
        # A chunk's credit is not cut short by a smaller prefill run meanwhile (a new
        # request's short prompt): each bulk call leaves at least its own time.
        gate._credit = max(gate._credit, work) if self.bulk else max(0.0, gate._credit - work)
        return result

    async def rest(self) -> None:
        """The power governor's rest for this turn's work (cancellable)."""
        if self.gate.pace is not None:
            await self.gate.pace(self.work_s)


class EngineGate:
    """Runs engine calls on a worker thread, one at a time, so concurrent slots interleave
    at chunk/token granularity instead of fighting over the cores.

    Calls wait in FIFO order, with one exception that keeps a long prefill from starving
    the other slots: each `bulk` call (a prefill chunk) earns the short calls (decode
    steps, each one batch of every generating slot: ds4d.daemon.batcher) as much engine
    time as it took (a smaller chunk run meanwhile does not cut that short), and while
    that credit lasts a waiting short call goes ahead of the queue. So a slot that is
    generating gets a burst of tokens between two chunks of another slot's prefill, not
    one token per chunk: it stalls at most about one chunk, and the prefill still gets at
    least half of the engine time. A new request's short prefill waits for at most the
    chunk being computed (FIFO), and its first decode step goes within the credit, ahead
    of the long prefill's next chunk. Chunks are sized by engine time
    (ds4d.daemon.chunking), so "one chunk" is a bounded stall at any depth.

    `pace(work_seconds)` (power throttling) is awaited after each call while the gate is
    still held, so the whole process keeps to the power level; it runs on the trio loop,
    so a cancelled request stops resting at once."""

    def __init__(
        self,
        pace: Callable[[float], Awaitable[None]] | None = None,
        clock: Callable[[], float] = time.perf_counter,
    ) -> None:
        self.pace = pace
        self.clock = clock  # measures each call's work
        self._busy = False
        self._waiting: deque[_Turn] = deque()
        self._credit = 0.0  # seconds of engine time short calls may take ahead of bulk ones
        self._deferred = False  # a release waits for the tasks to settle

    async def run(self, fn: Callable[..., T], *args: object, bulk: bool = False) -> T:
        async with self.hold(bulk) as engine:
            result = await engine.work(fn, *args)
            await engine.rest()
            return result

    @asynccontextmanager
    async def hold(self, bulk: bool = False) -> AsyncIterator[Held]:
        """The gate, held for one turn: `work` runs on the engine's thread, `rest` paces
        what it took. For a caller that must decide what to run once its turn has come
        (the decode batcher gathers its steps then)."""
        await self._acquire(bulk)
        try:
            yield Held(self, bulk)
        finally:
            self._release()

    async def _acquire(self, bulk: bool) -> None:
        if not self._busy and not self._waiting:
            self._busy = True
            try:
                await trio.lowlevel.checkpoint()  # a checkpoint on every path, as a lock has
            except BaseException:
                self._release(settle=False)
                raise
            return
        turn = _Turn(bulk)
        self._waiting.append(turn)
        try:
            await turn.event.wait()
        except BaseException:
            if turn.granted:  # handed the gate while being cancelled: pass it on
                self._release(settle=False)
            else:
                self._waiting.remove(turn)
            raise

    def _release(self, settle: bool = True) -> None:
        turn = self._next()
        if settle and turn is not None and turn.bulk and self._credit > 0:
            # A decoding slot queues its next step only after handling this one's token,
            # and a slot whose prefill just ended queues its first step only after this
            # call returns: the gate stays reserved until every task has moved on (such
            # a step is then waiting, or its slot finished or waits for its client).
            if not self._deferred:
                self._deferred = True
                trio.lowlevel.spawn_system_task(self._release_when_settled)
            return
        if turn is None:
            self._busy = False
            return
        self._waiting.remove(turn)
        turn.granted = True
        turn.event.set()  # the gate passes straight to it: no one can slip in between

    async def _release_when_settled(self) -> None:
        try:
            await trio.testing.wait_all_tasks_blocked()
        finally:
            self._deferred = False
            self._release(settle=False)

    def _next(self) -> _Turn | None:
        if self._credit > 0:
            for turn in self._waiting:
                if not turn.bulk:
                    return turn
        return self._waiting[0] if self._waiting else None
