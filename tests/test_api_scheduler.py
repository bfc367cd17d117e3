"""Slot assignment and the wait queue, on real engine sessions: longest shared prefix,
else least recently used; FIFO hand-over; a full queue refused; a cancelled waiter leaves
the line; the engine gate runs one call at a time."""

from __future__ import annotations

import pytest
import trio
from trio.testing import MockClock, wait_all_tasks_blocked

from ds4d.api.common import ApiError
from ds4d.daemon.scheduler import EngineGate, SlotPool
from ds4d.state.slots import Slot


@pytest.fixture
def pool(engine):
    slots = [Slot(i, engine.new_session(64), 64) for i in range(2)]
    slots[0].session.eval([1, 2, 3, 4])
    slots[1].session.eval([1, 9])
    slots[0].last_used, slots[1].last_used = 10.0, 5.0
    return SlotPool(slots, queue_size=2)


def test_longest_prefix_else_least_recently_used(pool):
    assert pool.request([1, 2, 3, 7]).slot.index == 0  # shares 3 tokens with slot 0
    pool.release(pool.slots[0])
    assert pool.request([1, 9, 9]).slot.index == 1
    pool.release(pool.slots[1])
    # nothing shared: the least recently used (slot 0 was released first)
    assert pool.request([42]).slot.index == 0
    assert pool.request([42]).slot.index == 1  # the other one is busy


def test_a_shared_template_head_does_not_claim_another_conversations_slot(engine):
    """Two conversations sharing only a fixed preamble go to different slots."""
    head, a, b = [1, 2, 3], list(range(100, 140)), list(range(200, 240))
    slots = [Slot(i, engine.new_session(64), 64) for i in range(2)]
    pool = SlotPool(slots, queue_size=2)
    slots[0].session.eval(head + a)
    slots[0].last_used, slots[1].last_used = 10.0, 5.0  # slot 1: empty and older
    assert pool.request(head + b).slot.index == 1
    pool.release(slots[1])
    slots[0].last_used = 1.0  # now the oldest: taken although its head is unrelated
    assert pool.request(head + b + [7]).slot.index == 0


def test_queue_is_fifo_bounded_and_cancellable(pool):
    async def main() -> None:
        a, b = pool.request([5]), pool.request([6])
        assert pool.busy == 2
        order: list[str] = []

        async def wait(name: str, ticket) -> None:
            await ticket.wait()
            order.append(name)

        first, second = pool.request([7]), pool.request([8])
        with pytest.raises(ApiError) as e:
            pool.request([9])
        assert e.value.status == 503 and e.value.headers["Retry-After"]
        async with trio.open_nursery() as nursery:
            nursery.start_soon(wait, "first", first)
            nursery.start_soon(wait, "second", second)
            await wait_all_tasks_blocked()
            assert order == [] and pool.waiting == 2
            pool.release(b.slot)
            await wait_all_tasks_blocked()
            pool.release(a.slot)
        assert order == ["first", "second"] and pool.waiting == 0

        pool.release(first.slot)
        pool.release(second.slot)
        held = [pool.request([1]), pool.request([2])]
        gone = pool.request([3])
        with trio.move_on_after(0.01):
            await gone.wait()
        assert pool.waiting == 0  # the cancelled waiter left the line
        for t in held:
            pool.release(t.slot)
        assert pool.busy == 0

    trio.run(main, clock=MockClock(autojump_threshold=0))  # move_on_after: virtual time


def test_engine_gate_runs_one_call_at_a_time():
    async def main() -> None:
        gate = EngineGate()
        running, peak = 0, 0

        def work() -> None:
            nonlocal running, peak
            running += 1
            peak = max(peak, running)
            import time

            # Reviewed exception: the work must take a while for a second call to be able
            # to overlap it if the gate let it in; the 20 ms is work, not a wait.
            time.sleep(0.02)
            running -= 1

        async with trio.open_nursery() as nursery:
            for _ in range(4):
                nursery.start_soon(gate.run, work)
        assert peak == 1

    trio.run(main)
