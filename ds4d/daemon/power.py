"""`--power N`: spend about N% of wall time computing, by resting between work units.

After a work unit (a prefill chunk, a decoded token) that took t seconds, ds4d rests
t * (100/N - 1) seconds, so busy time / wall time ~= N/100. Only the timing changes, never
the arithmetic, so the output is identical at every level. The level can change at any
time (`ds4ctl power N`, a config reload) and a rest in progress follows it, so raising
the power releases a long rest at once.

The engine loop (ds4d.serving.loop) awaits `governor.rest(work_seconds)` through the
compute gate after every engine step while it still holds the engine: the whole process keeps to the
level, and because the rest runs on the trio loop, a request cancelled mid-rest (its
client went away) stops resting at once and frees the engine.
"""

from __future__ import annotations

import trio

MIN_POWER, MAX_POWER = 1, 100
# How often a rest re-reads the level, so raising it ends a long rest promptly.
_LEVEL_POLL_S = 0.05


class PowerGovernor:
    def __init__(self, level: int = MAX_POWER) -> None:
        self._level = _checked(level)

    @property
    def level(self) -> int:
        return self._level

    def set_level(self, level: int) -> None:
        self._level = _checked(level)

    def rest_for(self, work_seconds: float) -> float:
        """Seconds to rest after `work_seconds` of work at the current level."""
        return max(0.0, work_seconds) * (MAX_POWER / self._level - 1.0)

    async def rest(self, work_seconds: float) -> None:
        """Rest on the trio loop for what `work_seconds` of work owes (cancellable).

        Timed by the loop's own clock, so tests can run it on trio's MockClock."""
        start = trio.current_time()
        while True:
            remaining = start + self.rest_for(work_seconds) - trio.current_time()
            if remaining <= 0:
                return
            await trio.sleep(min(remaining, _LEVEL_POLL_S))


def _checked(level: int) -> int:
    if isinstance(level, bool) or not isinstance(level, int) or not MIN_POWER <= level <= MAX_POWER:
        raise ValueError(f"power must be an integer from {MIN_POWER} to {MAX_POWER}, not {level!r}")
    return level
