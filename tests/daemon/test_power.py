"""Power governor and the compute gate that applies it: the rest owed follows the level,
level changes apply mid-rest, a cancelled rest ends at once (and frees the engine), and
paced work rests exactly what it owes (the engine loop's own pacing, once per step:
tests/serving/test_loop.py).

Rests run on trio's MockClock (autojump), so every check is on the sleeps the governor
requests, never on wall time or CPU share of a shared machine."""

from __future__ import annotations

import pytest
import trio
from trio.testing import MockClock

from ds4d.daemon.power import PowerGovernor
from ds4d.serving.gate import ComputeGate


def run_virtual(fn):
    return trio.run(fn, clock=MockClock(autojump_threshold=0))


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


@pytest.mark.parametrize("level", [100, 50, 25, 1])
def test_paced_calls_rest_what_their_work_owes(level):
    """Every turn of the gate is followed by the rest its work owes at the level, so
    wall time = work * 100 / level: the busy share is the level."""
    governor = PowerGovernor(level)
    work: list[float] = []

    async def pace(seconds: float) -> None:
        work.append(seconds)
        await governor.rest(seconds)

    async def main() -> float:
        gate = ComputeGate(pace)
        start = trio.current_time()
        for n in range(5):
            async with gate.turn():
                await trio.sleep(0.01 * n)  # the work, in virtual time
                await gate.rest(0.01 * n)
        return trio.current_time() - start - sum(work)

    rested = run_virtual(main)
    assert len(work) == 5 and all(w >= 0 for w in work)
    assert rested == pytest.approx(sum(work) * (100 / level - 1), abs=1e-9)


def test_a_long_rest_is_the_requested_length():
    async def main() -> float:
        start = trio.current_time()
        await PowerGovernor(10).rest(2.0)  # owes 18 s
        return trio.current_time() - start

    assert run_virtual(main) == pytest.approx(18.0)


def test_raising_the_level_ends_a_rest_at_once():
    g = PowerGovernor(1)

    async def main() -> float:
        async with trio.open_nursery() as nursery:
            nursery.start_soon(g.rest, 1.0)  # owes 99 s at power 1
            await trio.sleep(0.1)  # virtual time
            g.set_level(100)
        return trio.current_time()

    # the rest re-reads the level at least every 50 ms
    assert run_virtual(main) <= 0.15 + 1e-9


def test_a_cancelled_rest_frees_the_engine_at_once():
    """A rest cancelled midway (its request went away) must not hold the engine for the
    rest owed."""
    governor = PowerGovernor(1)
    gate = ComputeGate(governor.rest)

    async def main() -> tuple[float, float]:
        with trio.move_on_after(0.2):  # cancelled 0.2 s in, mid-rest
            async with gate.turn():
                await gate.rest(0.05)  # owes 4.95 s
        cancelled_after = trio.current_time()
        async with gate.turn():
            free_at = trio.current_time()
        return cancelled_after, free_at

    cancelled_after, free_at = run_virtual(main)
    assert cancelled_after == pytest.approx(0.2) and free_at == cancelled_after
