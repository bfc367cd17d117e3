"""Power governor: the rest owed follows the level, changes apply mid-rest, cancel is
prompt, and a paced loop's busy share is the level.

Work units here are sleeps or spins measured in wall time, as the daemon's engine gate
measures them; the machine is shared, so the checks compare wall times the pacer itself
measured rather than assume the CPU is ours."""

from __future__ import annotations

import threading
import time

import pytest
import trio

from ds4d.daemon.power import PowerGovernor


def paced_loop(governor: PowerGovernor, units: int = 10, unit_s: float = 0.02) -> float:
    """Wall time of `units` work units paced by `governor`, over the work's own time."""
    pacer = governor.pacer()
    work = 0.0
    start = time.perf_counter()
    for _ in range(units):
        t = time.perf_counter()
        time.sleep(unit_s)
        work += time.perf_counter() - t
        pacer.unit_done()
    return (time.perf_counter() - start) / work


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
    assert paced_loop(PowerGovernor(level)) == pytest.approx(100 / level, rel=0.15)


def test_raising_the_level_ends_a_rest_at_once():
    g = PowerGovernor(1)
    started = time.perf_counter()
    t = threading.Timer(0.1, g.set_level, args=(100,))
    t.start()
    g.rest(1.0)  # owes 99 s at power 1
    assert time.perf_counter() - started < 1.0
    t.join()


def test_cancel_event_ends_a_rest():
    g = PowerGovernor(1)
    cancelled = threading.Event()
    threading.Timer(0.1, cancelled.set).start()
    started = time.perf_counter()
    g.rest(1.0, cancelled)
    assert time.perf_counter() - started < 0.5


def test_async_rest_on_the_trio_loop():
    g = PowerGovernor(50)

    async def main() -> tuple[float, float]:
        pacer = g.pacer()
        start = time.perf_counter()
        time.sleep(0.05)
        work = time.perf_counter() - start
        await pacer.aunit_done()
        return work, time.perf_counter() - start

    work, total = trio.run(main)
    assert total == pytest.approx(2 * work, rel=0.2)
