"""Power governor and the engine gate that applies it: the rest owed follows the level,
level changes apply mid-rest, a cancelled request stops resting at once (and frees the
engine), and a paced loop's busy share is the level.

Work units here are sleeps measured in wall time, as the engine gate measures its calls;
the machine is shared, so the checks compare wall times the loop itself measured rather
than assume the CPU is ours."""

from __future__ import annotations

import time

import pytest
import trio

from ds4d.daemon.power import PowerGovernor
from ds4d.daemon.scheduler import EngineGate


def paced_share(level: int, units: int = 10, unit_s: float = 0.02) -> float:
    """Wall time of `units` engine-gate calls paced at `level`, over the work's own time."""
    gate = EngineGate(PowerGovernor(level).rest)
    work = 0.0

    def unit() -> None:
        nonlocal work
        t = time.perf_counter()
        time.sleep(unit_s)
        work += time.perf_counter() - t

    async def main() -> float:
        start = time.perf_counter()
        for _ in range(units):
            await gate.run(unit)
        return time.perf_counter() - start

    return trio.run(main) / work


def test_rest_formula():
    g = PowerGovernor(50)
    assert g.rest_for(0.2) == pytest.approx(0.2)
    g.set_level(25)
    assert g.rest_for(0.2) == pytest.approx(0.6)
    g.set_level(100)
    assert g.rest_for(0.2) == 0.0
    for bad in (0, 101, 50.0, True):
        with pytest.raises(ValueError):
            g.set_level(bad)


@pytest.mark.parametrize("level", [100, 50, 25])
def test_wall_time_is_work_over_level(level):
    assert paced_share(level) == pytest.approx(100 / level, rel=0.15)


def test_raising_the_level_ends_a_rest_at_once():
    g = PowerGovernor(1)

    async def main() -> float:
        started = time.perf_counter()
        async with trio.open_nursery() as nursery:
            nursery.start_soon(g.rest, 1.0)  # owes 99 s at power 1
            await trio.sleep(0.1)
            g.set_level(100)
        return time.perf_counter() - started

    assert trio.run(main) < 1.0


def test_cancelled_request_stops_resting_and_frees_the_engine():
    """A client that goes away mid-rest must not hold the engine for the rest owed."""
    gate = EngineGate(PowerGovernor(1).rest)

    async def main() -> tuple[float, str]:
        started = time.perf_counter()
        with trio.move_on_after(0.2):  # the request is cancelled 0.2 s in
            await gate.run(time.sleep, 0.05)  # owes ~5 s of rest at power 1
        cancelled_after = time.perf_counter() - started
        gate.pace = None
        return cancelled_after, await gate.run(str, "engine free")

    cancelled_after, result = trio.run(main)
    assert cancelled_after < 0.5 and result == "engine free"
