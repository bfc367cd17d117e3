"""The compute gate: engine work of every model's loop, one step at a time.

Each model has its own engine loop (ds4d.serving.loop); they share one gate, so the
engines of two models never compute at once (they would fight over the same cores), and
they take turns step by step (trio's Lock is fair). After each step the power governor's
rest (`pace(work_seconds)`, ds4d.daemon.power) is awaited while the gate is still held,
so the whole process keeps to the power level."""

from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager

import trio

Pace = Callable[[float], Awaitable[None]]


class ComputeGate:
    def __init__(self, pace: Pace | None = None) -> None:
        self._pace = pace
        self._lock = trio.Lock()

    @asynccontextmanager
    async def turn(self) -> AsyncIterator[None]:
        """The engine, for one step (the caller runs its work on a worker thread)."""
        async with self._lock:
            yield

    async def rest(self, work_s: float) -> None:
        """The governor's rest for `work_s` of engine work (cancellable)."""
        if self._pace is not None:
            await self._pace(work_s)
