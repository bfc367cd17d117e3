"""Power governor: busy share follows the level, changes apply mid-rest, cancel is prompt."""

from __future__ import annotations

import threading
import time

import pytest
import trio

from ds4d.daemon.power import PowerGovernor


def busy(seconds: float) -> None:
    end = time.thread_time() + seconds
    while time.thread_time() < end:
        pass


def busy_share(governor: PowerGovernor, units: int = 15, unit_s: float = 0.02) -> float:
    """Thread CPU time / wall time of `units` work units paced by `governor`."""
    pacer = governor.pacer()
    wall0, cpu0 = time.perf_counter(), time.thread_time()
    for _ in range(units):
        busy(unit_s)
        pacer.unit_done()
    return (time.thread_time() - cpu0) / (time.perf_counter() - wall0)


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


def test_busy_share_follows_the_level():
    full = busy_share(PowerGovernor(100))
    half = busy_share(PowerGovernor(50))
    assert full > 0.8
    assert half / full == pytest.approx(0.5, abs=0.12)


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

    async def main() -> float:
        pacer = g.pacer()
        start = trio.current_time()
        busy(0.05)
        await pacer.aunit_done()
        return trio.current_time() - start

    assert trio.run(main) == pytest.approx(0.1, abs=0.04)
