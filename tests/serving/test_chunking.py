"""Prefill chunk sizes from measured engine time (ds4d.serving.chunking): chunks take about
the target at every depth, within the floor and ceiling (one C call), from what the engine
has shown; and a slot's sync prefills in the sizes it is given, on a real engine session."""

from __future__ import annotations

import pytest

from ds4d.engine.engine import PREFILL_CHUNK
from ds4d.serving.chunking import ChunkSizer
from ds4d.state.sync import EvalChunk, KVCalls, SlotSync, make_plan, run_call


def test_before_anything_is_measured_the_first_size_is_used():
    assert ChunkSizer(first_tokens=64).size(0) == 64
    assert ChunkSizer(first_tokens=64).size(10_000) == 64


def test_a_constant_cost_gives_the_target_in_tokens():
    sizer = ChunkSizer(target_s=0.25, max_tokens=256)
    for depth in range(0, 2048, 128):
        sizer.observe(depth, 128, 128 * 0.002)  # 2 ms a token
    assert sizer.size(0) == 125
    assert sizer.size(1500) == 125


def test_the_cost_grows_with_depth_and_deep_chunks_shrink():
    # 1 ms a token at depth 0, one more for every 2000 tokens of context.
    sizer = ChunkSizer(target_s=0.25, min_tokens=16, max_tokens=256)

    def cost(depth: float) -> float:
        return 0.001 + depth * 0.0000005

    for depth in range(0, 4000, 200):
        sizer.observe(depth, 200, 200 * cost(depth + 100))
    assert sizer.cost(8000) == pytest.approx(cost(8000))
    size = sizer.size(8000)  # 5 ms a token there: about 50 tokens
    assert 48 <= size <= 50
    assert size * cost(8000 + size / 2) == pytest.approx(0.25, rel=0.02)
    shallow = sizer.size(0)  # its tokens average a little deeper than 0: under 250
    assert 230 <= shallow < 250
    assert shallow * cost(shallow / 2) == pytest.approx(0.25, rel=0.02)


def test_shallower_than_anything_seen_the_cost_is_not_extrapolated_down():
    # Deep chunks only, with a steep slope (noise, or a busy moment at the end): followed
    # down to depth 0 the line would promise nearly free tokens and one huge chunk.
    sizer = ChunkSizer(target_s=0.25, min_tokens=16, max_tokens=256)
    for depth in range(5000, 6000, 32):
        sizer.observe(depth, 32, 32 * (0.004 + (depth - 5000) * 0.000004))
    shallowest = sizer.cost(5016)  # the mean depth of the first chunk seen
    assert shallowest == pytest.approx(0.004, rel=0.01)
    assert sizer.cost(0) == sizer.cost(2000) == shallowest  # not the line's 0 there
    assert sizer.size(0) == round(0.25 / shallowest)
    assert sizer.size(7000) < sizer.size(5000)  # deeper still follows the line


def test_sizes_stay_within_the_floor_and_the_ceiling():
    slow = ChunkSizer(target_s=0.25, min_tokens=32, max_tokens=256)
    slow.observe(0, 32, 10.0)
    assert slow.size(0) == 32
    fast = ChunkSizer(target_s=0.25, min_tokens=32, max_tokens=256)
    fast.observe(0, 256, 0.001)
    assert fast.size(0) == 256


def test_noise_saying_deeper_is_cheaper_is_ignored():
    sizer = ChunkSizer(target_s=0.25, min_tokens=8, max_tokens=256)
    sizer.observe(0, 100, 100 * 0.004)
    sizer.observe(3000, 100, 100 * 0.002)  # a busy moment early on, a quiet one later
    assert sizer.cost(100_000) == pytest.approx(0.003)  # the mean: no negative slope


def test_a_tail_under_half_a_chunk_goes_with_the_chunk_before_it():
    sizer = ChunkSizer(target_s=0.25, min_tokens=16, max_tokens=256)
    sizer.observe(0, 100, 100 * 0.008)  # 8 ms a token: 31 tokens a chunk
    n = sizer.size(0)
    assert n == 31
    assert sizer.size(0, remaining=n + n // 2 - 1) == n + n // 2 - 1  # one call
    assert sizer.size(0, remaining=n + n // 2) == n  # a tail of half a chunk: its own
    assert sizer.size(0, remaining=5) == 5
    assert ChunkSizer(first_tokens=64).size(0, remaining=90) == 90


def test_a_size_is_never_more_than_one_call():
    """A tail joined to the last chunk still fits the ceiling, which is at most one C
    call (the engine's PREFILL_CHUNK): the time observed for a chunk is one call's."""
    sizer = ChunkSizer(target_s=0.25, min_tokens=16, max_tokens=256)
    sizer.observe(0, 256, 0.001)  # fast: every chunk at the ceiling
    assert sizer.size(0, remaining=256 + 100) == 256
    with pytest.raises(ValueError):
        ChunkSizer(max_tokens=PREFILL_CHUNK + 1)


def test_empty_and_instant_chunks_are_not_measurements():
    sizer = ChunkSizer(first_tokens=64)
    sizer.observe(0, 0, 1.0)
    sizer.observe(0, 10, 0.0)
    assert sizer.cost(0) is None and sizer.size(0) == 64


def test_bad_settings_are_refused():
    with pytest.raises(ValueError):
        ChunkSizer(min_tokens=64, first_tokens=32)
    with pytest.raises(ValueError):
        ChunkSizer(target_s=0)


def test_a_sync_prefills_in_the_sizes_it_is_given_one_call_each(engine):
    session = engine.new_session(512)
    prompt = list(range(10, 410))
    calls: list[int] = []
    sync = SlotSync(session, "", prompt, make_plan(None, session, "", prompt))
    run = KVCalls(None)
    while (call := sync.next(8 + session.n_tokens // 4)) is not None:  # 8, 10, 12, ...
        assert isinstance(call, EvalChunk)
        calls.append(len(call.tokens))
        sync.took(call, run_call(run, session, call))
    assert sum(calls) == len(prompt) and list(session.tokens) == prompt
    depths = [sum(calls[:i]) for i in range(len(calls))]
    assert calls[:-1] == [min(PREFILL_CHUNK, 8 + d // 4) for d in depths[:-1]]
    assert max(calls) <= PREFILL_CHUNK
    assert sync.result().cached_tokens == 0 and sync.result().tokens == prompt
