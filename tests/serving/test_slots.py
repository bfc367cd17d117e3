"""Slot choice, on real engine sessions: longest shared prefix, else least recently used;
a shared template head does not claim another conversation's slot; completion slots are
a class of their own. (Queueing, cancellation and the engine's turns are the engine
loop's: tests/serving/test_loop.py.)"""

from __future__ import annotations

import pytest

from ds4d.serving.slots import SlotPool
from ds4d.state.slots import Slot


@pytest.fixture
def pool(engine):
    slots = [Slot(i, engine.new_session(64), 64) for i in range(2)]
    slots[0].session.eval([1, 2, 3, 4])
    slots[1].session.eval([1, 9])
    slots[0].last_used, slots[1].last_used = 10.0, 5.0
    return SlotPool(slots)


def test_longest_prefix_else_least_recently_used(pool):
    assert pool.take([1, 2, 3, 7]).index == 0  # shares 3 tokens with slot 0
    pool.release(pool.slots[0])
    assert pool.take([1, 9, 9]).index == 1
    pool.release(pool.slots[1])
    # nothing shared: the least recently used (slot 0 was released first)
    assert pool.take([42]).index == 0
    assert pool.take([42]).index == 1  # the other one is busy
    assert pool.take([42]) is None and pool.busy == 2


def test_a_shared_template_head_does_not_claim_another_conversations_slot(engine):
    """Two conversations sharing only a fixed preamble go to different slots."""
    head, a, b = [1, 2, 3], list(range(100, 140)), list(range(200, 240))
    slots = [Slot(i, engine.new_session(64), 64) for i in range(2)]
    pool = SlotPool(slots)
    slots[0].session.eval(head + a)
    slots[0].last_used, slots[1].last_used = 10.0, 5.0  # slot 1: empty and older
    assert pool.take(head + b).index == 1
    pool.release(slots[1])
    slots[0].last_used = 1.0  # now the oldest: taken although its head is unrelated
    assert pool.take(head + b + [7]).index == 0


def test_completion_slots_are_a_class_of_their_own(engine):
    slots = [Slot(i, engine.new_session(64), 64) for i in range(3)]
    pool = SlotPool(slots, completion_slots=1)
    assert pool.take([5], "completion").index == 2
    assert pool.take([6], "completion") is None  # waits for its own, never a chat slot
    assert pool.idle("chat") == 2 and pool.idle("background") == 2
    assert {pool.take([7]).index, pool.take([8], "background").index} == {0, 1}
    assert pool.take([9]) is None
    with pytest.raises(ValueError):
        SlotPool(slots, completion_slots=3)  # nothing left for the rest


def test_a_completion_goes_on_from_the_context_chunks_it_shares(engine):
    """llama.vim's ring of chunks grew: the warm-up shares the chunks (not half the slot:
    the file followed them) and goes on from them; a chat prompt sharing as much would
    not claim the slot, nor a completion sharing only the FIM markers' few tokens."""
    chunks, file = list(range(100, 400)), list(range(1000, 1400))
    slots = [Slot(i, engine.new_session(1024), 1024) for i in range(2)]
    pool = SlotPool(slots)
    slots[0].session.eval(chunks + file)
    slots[0].last_used, slots[1].last_used = 10.0, 5.0  # slot 1: empty and older
    warm = chunks + list(range(500, 520))
    assert pool.take(warm, "completion").index == 0
    pool.release(slots[0])
    slots[0].last_used = 10.0
    assert pool.take(warm).index == 1
    pool.release(slots[1])
    slots[1].last_used = 5.0
    assert pool.take(chunks[:8] + file, "completion").index == 1
