"""Slot assignment: longest shared token prefix, else least recently used, else a fair
bounded queue; and the engine gate every engine call goes through."""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Callable, Sequence
from typing import Any

import trio

from ds4d.api.common import ApiError
from ds4d.state.matching import common_prefix
from ds4d.state.slots import Slot

RETRY_AFTER_S = 2


class SlotPool:
    def __init__(self, slots: list[Slot], queue_size: int) -> None:
        self.slots = slots
        self.queue_size = queue_size
        self._waiters: deque[tuple[trio.Event, list[Slot | None]]] = deque()

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
        if best_len > 0:
            return best
        return min(idle, key=lambda s: s.last_used)

    async def acquire(self, prompt: Sequence[int]) -> Slot:
        """A slot for this prompt: at once if one is idle (the one sharing most, else the
        least recently used), else after the requests queued before this one. A full
        queue is refused with 503 and Retry-After."""
        if not self._waiters:
            slot = self.best_idle(prompt)
            if slot is not None:
                return self._take(slot)
        if len(self._waiters) >= self.queue_size:
            raise ApiError(503, "all slots are busy and the queue is full; retry later",
                           kind="server_error", code="overloaded",
                           headers={"Retry-After": str(RETRY_AFTER_S)})
        event = trio.Event()
        box: list[Slot | None] = [None]
        entry = (event, box)
        self._waiters.append(entry)
        try:
            await event.wait()
        except BaseException:
            if box[0] is not None:  # handed a slot just as we were cancelled
                self.release(box[0])
            else:
                self._waiters.remove(entry)
            raise
        assert box[0] is not None
        return box[0]

    def _take(self, slot: Slot) -> Slot:
        slot.busy = True
        slot.requests += 1
        return slot

    def release(self, slot: Slot) -> None:
        slot.last_used = time.monotonic()
        slot.busy = False
        if self._waiters:
            event, box = self._waiters.popleft()
            box[0] = self._take(slot)
            event.set()


class EngineGate:
    """Runs engine calls on a worker thread, one at a time in FIFO order (trio.Lock is
    fair), so concurrent slots interleave at chunk/token granularity instead of fighting
    over the cores. `after_unit` (power pacing) runs on the worker after each call."""

    def __init__(self, after_unit: Callable[[float], None] | None = None) -> None:
        self.lock = trio.Lock()
        self.after_unit = after_unit

    async def run(self, fn: Callable[..., Any], *args: Any) -> Any:
        async with self.lock:
            return await trio.to_thread.run_sync(self._timed, fn, args)

    def _timed(self, fn: Callable[..., Any], args: tuple[Any, ...]) -> Any:
        start = time.perf_counter()
        try:
            return fn(*args)
        finally:
            if self.after_unit is not None:
                self.after_unit(time.perf_counter() - start)
