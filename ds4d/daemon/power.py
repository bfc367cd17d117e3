"""`--power N`: spend about N% of wall time computing, by resting between work units.

After a work unit (a prefill chunk, a decoded token) that took t seconds, the worker rests
t * (100/N - 1) seconds, so busy time / wall time ~= N/100. Only the timing changes, never
the arithmetic, so the output is identical at every level. The level can change at any
time (`ds4ctl power N`, a config reload); a rest in progress is recomputed at once, so
raising the power releases a long rest immediately.

Use one `Pacer` per stream of work, on the thread doing the work:

    pacer = governor.pacer(cancelled)     # cancelled: threading.Event | None
    session.eval(tokens, on_chunk=lambda done, total: pacer.unit_done())
    for ...: step(); pacer.unit_done()    # or `await pacer.aunit_done()` on the trio loop
"""

from __future__ import annotations

import threading
import time

MIN_POWER, MAX_POWER = 1, 100
# A cancelled request must not wait out a long rest: check at least this often.
_CANCEL_POLL_S = 0.05


class PowerGovernor:
    def __init__(self, level: int = MAX_POWER) -> None:
        self._cond = threading.Condition()
        self._level = _checked(level)

    @property
    def level(self) -> int:
        return self._level

    def set_level(self, level: int) -> None:
        with self._cond:
            self._level = _checked(level)
            self._cond.notify_all()

    def rest_for(self, work_seconds: float) -> float:
        """Seconds to rest after `work_seconds` of work at the current level."""
        return max(0.0, work_seconds) * (MAX_POWER / self._level - 1.0)

    def pacer(self, cancelled: threading.Event | None = None) -> Pacer:
        return Pacer(self, cancelled)

    def rest(self, work_seconds: float, cancelled: threading.Event | None = None) -> None:
        """Block the calling (worker) thread for the rest owed after `work_seconds`."""
        start = time.perf_counter()
        with self._cond:
            while True:
                remaining = start + self.rest_for(work_seconds) - time.perf_counter()
                if remaining <= 0 or (cancelled is not None and cancelled.is_set()):
                    return
                self._cond.wait(min(remaining, _CANCEL_POLL_S) if cancelled else remaining)

    async def arest(self, work_seconds: float) -> None:
        """`rest` for code running on the trio loop (cancellable the trio way)."""
        import trio

        start = time.perf_counter()
        while True:
            remaining = start + self.rest_for(work_seconds) - time.perf_counter()
            if remaining <= 0:
                return
            await trio.sleep(min(remaining, 0.1))


class Pacer:
    """Measures the work since the previous unit ended and rests accordingly."""

    def __init__(self, governor: PowerGovernor, cancelled: threading.Event | None = None):
        self._governor = governor
        self._cancelled = cancelled
        self._mark = time.perf_counter()

    def restart(self) -> None:
        """Start timing afresh (after an idle gap that was not work)."""
        self._mark = time.perf_counter()

    def unit_done(self) -> None:
        work = time.perf_counter() - self._mark
        if self._governor.level < MAX_POWER:
            self._governor.rest(work, self._cancelled)
        self._mark = time.perf_counter()

    async def aunit_done(self) -> None:
        work = time.perf_counter() - self._mark
        if self._governor.level < MAX_POWER:
            await self._governor.arest(work)
        self._mark = time.perf_counter()


def _checked(level: int) -> int:
    if isinstance(level, bool) or not isinstance(level, int) or not MIN_POWER <= level <= MAX_POWER:
        raise ValueError(f"power must be an integer from {MIN_POWER} to {MAX_POWER}, not {level!r}")
    return level
