"""Slot assignment and the wait queue, on real engine sessions: longest shared prefix,
else least recently used; FIFO hand-over; a full queue refused; a cancelled waiter leaves
the line; the engine gate runs one call at a time, and lets decode steps go ahead of a
prefill for as long as its last chunk took."""

from __future__ import annotations

import threading

import pytest
import trio
from trio.testing import MockClock, wait_all_tasks_blocked

from ds4d.api.common import refusal_error
from ds4d.chat.errors import Overloaded
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
        with pytest.raises(Overloaded) as e:
            pool.request([9])
        err = refusal_error(e.value)
        assert err.status == 503 and err.code == "overloaded" and err.headers["Retry-After"]
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


class _Work:
    """Engine calls on a clock they advance themselves: each takes the seconds it is
    given, so the gate's credit arithmetic is exact. The first call can be held until the
    test has queued the others behind it."""

    def __init__(self) -> None:
        self.now = 0.0
        self.order: list[str] = []
        self.hold = threading.Event()

    def clock(self) -> float:
        return self.now

    def call(self, name: str, seconds: float, held: bool = False) -> None:
        if held:
            self.hold.wait(30)  # released by the test once the queue is built
        self.order.append(name)
        self.now += seconds


def _gate_order(calls: list[tuple[str, float, bool]]) -> list[str]:
    """Runs calls[0] (held), queues the rest in order behind it, releases: the order in
    which the gate ran them. Each call is (name, seconds, bulk)."""
    work = _Work()

    async def main() -> None:
        gate = EngineGate(clock=work.clock)
        async with trio.open_nursery() as nursery:
            name, seconds, bulk = calls[0]
            nursery.start_soon(lambda: gate.run(work.call, name, seconds, True, bulk=bulk))
            await wait_all_tasks_blocked()
            for name, seconds, bulk in calls[1:]:
                nursery.start_soon(
                    lambda n=name, s=seconds, b=bulk: gate.run(work.call, n, s, bulk=b)
                )
                await wait_all_tasks_blocked()
            work.hold.set()

    trio.run(main)
    return work.order


def test_gate_is_fifo_without_prefill_credit():
    calls = [("step0", 1.0, False), ("chunk", 1.0, True), ("step1", 0.1, False)]
    assert _gate_order(calls) == ["step0", "chunk", "step1"]


def test_decode_steps_go_ahead_of_prefill_for_as_long_as_a_chunk_took():
    # A 1 s chunk earns the steps 1 s: three 0.3 s steps pass the queued chunk...
    calls = [
        ("chunk1", 1.0, True),
        ("chunk2", 1.0, True),
        ("a", 0.3, False),
        ("b", 0.3, False),
        ("c", 0.3, False),
    ]
    assert _gate_order(calls) == ["chunk1", "a", "b", "c", "chunk2"]
    # ...but once they have used it up, the chunk's turn comes before the next step.
    calls = [
        ("chunk1", 1.0, True),
        ("chunk2", 1.0, True),
        ("a", 0.6, False),
        ("b", 0.6, False),
        ("c", 0.3, False),
    ]
    assert _gate_order(calls) == ["chunk1", "a", "b", "chunk2", "c"]


def test_a_decoding_slot_keeps_its_turns_while_the_credit_lasts():
    """A slot asks for its next step only after handling the last one: the gate waits for
    it rather than handing the turn to the queued chunk at once."""
    work = _Work()

    async def decode(gate: EngineGate) -> None:
        for name in ("a", "b", "c"):
            await gate.run(work.call, name, 0.3)
            await trio.lowlevel.checkpoint()  # handling the token: emitting it, parsing

    async def main() -> None:
        gate = EngineGate(clock=work.clock)
        async with trio.open_nursery() as nursery:
            nursery.start_soon(lambda: gate.run(work.call, "chunk1", 1.0, True, bulk=True))
            await wait_all_tasks_blocked()
            nursery.start_soon(lambda: gate.run(work.call, "chunk2", 1.0, bulk=True))
            await wait_all_tasks_blocked()
            nursery.start_soon(decode, gate)
            await wait_all_tasks_blocked()
            work.hold.set()

    trio.run(main)
    assert work.order == ["chunk1", "a", "b", "c", "chunk2"]


def test_a_cancelled_waiter_leaves_the_gate_usable():
    work = _Work()

    async def main() -> None:
        gate = EngineGate(clock=work.clock)
        async with trio.open_nursery() as nursery:
            nursery.start_soon(lambda: gate.run(work.call, "chunk", 1.0, True, bulk=True))
            await wait_all_tasks_blocked()
            scope = trio.CancelScope()
            nursery.start_soon(lambda: _cancellable(gate, work, scope))
            await wait_all_tasks_blocked()
            scope.cancel()  # while it waits behind the held chunk
            await wait_all_tasks_blocked()
            nursery.start_soon(lambda: gate.run(work.call, "after", 0.1))
            await wait_all_tasks_blocked()
            work.hold.set()
        await gate.run(work.call, "last", 0.1)

    trio.run(main)
    assert work.order == ["chunk", "after", "last"]


async def _cancellable(gate: EngineGate, work: _Work, scope: trio.CancelScope) -> None:
    with scope:
        await gate.run(work.call, "cancelled", 0.1)


def test_a_new_requests_first_step_goes_ahead_of_the_long_prefills_next_chunk():
    """A short request arriving during a long prefill: its own prefill runs after the
    chunk being computed, its first decode step right after that (the gate waits for it
    to be queued), and the long chunk's credit is not cut short by the small prefill."""
    work = _Work()

    async def short_request(gate: EngineGate) -> None:
        await gate.run(work.call, "short-prefill", 0.1, bulk=True)
        await trio.lowlevel.checkpoint()  # sending its usage, joining the decode batch
        for name in ("t1", "t2", "t3"):
            await gate.run(work.call, name, 0.2)
            await trio.lowlevel.checkpoint()  # handling the token

    async def main() -> None:
        gate = EngineGate(clock=work.clock)
        async with trio.open_nursery() as nursery:
            nursery.start_soon(lambda: gate.run(work.call, "chunk1", 1.0, True, bulk=True))
            await wait_all_tasks_blocked()
            nursery.start_soon(short_request, gate)
            await wait_all_tasks_blocked()
            nursery.start_soon(lambda: gate.run(work.call, "chunk2", 1.0, bulk=True))
            await wait_all_tasks_blocked()
            work.hold.set()

    trio.run(main)
    # 1 s of credit from chunk1: the short prefill (0.1 s) leaves it whole, and three
    # 0.2 s steps fit in it.
    assert work.order == ["chunk1", "short-prefill", "t1", "t2", "t3", "chunk2"]
