"""Slot assignment: longest shared token prefix, else least recently used, else a fair
bounded queue; and the engine gate every engine call goes through."""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Awaitable, Callable, Sequence
from typing import Any

import trio

from ds4d.api.common import ApiError
from ds4d.state.matching import common_prefix
from ds4d.state.slots import Slot

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
        queue behind the requests already waiting. A full queue is refused with 503 and
        Retry-After."""
        if not self._waiters:
            slot = self.best_idle(prompt)
            if slot is not None:
                return Ticket(self, self._take(slot))
        if len(self._waiters) >= self.queue_size:
            raise ApiError(503, "all slots are busy and the queue is full; retry later",
                           kind="server_error", code="overloaded",
                           headers={"Retry-After": str(RETRY_AFTER_S)})
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


class EngineGate:
    """Runs engine calls on a worker thread, one at a time in FIFO order (trio.Lock is
    fair), so concurrent slots interleave at chunk/token granularity instead of fighting
    over the cores. `pace(work_seconds)` (power throttling) is awaited after each call
    while the gate is still held, so the whole process keeps to the power level; it runs
    on the trio loop, so a cancelled request stops resting at once."""

    def __init__(self, pace: Callable[[float], Awaitable[None]] | None = None) -> None:
        self.lock = trio.Lock()
        self.pace = pace

    async def run(self, fn: Callable[..., Any], *args: Any) -> Any:
        async with self.lock:
            start = time.perf_counter()
            result = await trio.to_thread.run_sync(fn, *args)
            if self.pace is not None:
                await self.pace(time.perf_counter() - start)
            return result
