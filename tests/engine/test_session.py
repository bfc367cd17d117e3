"""Session semantics: exact rewind, save/load payloads, chunk callbacks, limits."""

from __future__ import annotations

import ctypes
import io
import json
import struct
from pathlib import Path

import numpy as np
import pytest

from ds4d.engine import ContextFullError, Engine, EngineError


class Cancelled(Exception):
    pass


@pytest.fixture(scope="module")
def tokens(data_dir: Path) -> list[int]:
    case = json.loads((data_dir / "vectors/smollm2/chat_redis.json").read_text())
    return case["prompt_tokens"] + [s["token"] for s in case["steps"]]


def test_info_and_empty_session(engine) -> None:
    info = engine.info
    assert (info.family, info.architecture, info.n_vocab, info.n_layer) == (
        "llama",
        "llama",
        49152,
        30,
    )
    assert info.n_ctx_train == 8192 and info.quant == "Q4_1" and len(info.fingerprint) == 64
    assert engine.chat_template and "<|im_start|>" in engine.chat_template
    assert engine.tokenizer is not None
    session = engine.new_session(100)
    assert session.tokens == [] and session.last_logits is None
    session.eval([])
    assert session.tokens == []
    # 30 layers x (K + V) x 3 kv heads x 64 dims in the engine's KV type (the default f16:
    # 2 bytes a value), for 100 positions (padded to 128); tests/engine/test_kv_types.py: each type
    row = {"f32": 64 * 4, "f16": 64 * 2, "q8_0": 2 * 34}[engine.kv_type]
    assert session.kv_bytes == 30 * 2 * 3 * row * 128


def test_rewind_then_eval_equals_fresh(engine, tokens) -> None:
    a, b, c = tokens[:30], tokens[30:50], [28, 4521, 349]
    session = engine.new_session(64)
    session.eval(a)
    session.eval(b)
    session.rewind(len(a))
    assert session.tokens == a
    session.eval(c)
    fresh = engine.new_session(64)
    fresh.eval(a)
    fresh.eval(c)
    assert session.tokens == fresh.tokens == a + c
    np.testing.assert_array_equal(session.compute_logits(), fresh.compute_logits())


def test_logits_after_rewind_are_recomputed(engine, tokens) -> None:
    session = engine.new_session(64)
    session.eval(tokens[:30])
    after = session.compute_logits().copy()
    session.eval(tokens[30:40])
    session.rewind(30)
    assert session.last_logits is None  # dropped: reading them is no hidden forward pass
    # One decode step over the last kept token: equal up to float rounding.
    assert np.abs(session.compute_logits() - after).max() < 5e-3
    assert session.tokens == tokens[:30]
    assert session.last_logits is not None  # kept until the next change
    with pytest.raises(EngineError, match="empty session"):
        engine.new_session(8).compute_logits()


def test_rewind_bounds(engine, tokens) -> None:
    session = engine.new_session(64)
    session.eval(tokens[:5])
    with pytest.raises(EngineError):
        session.rewind(6)
    session.rewind(5)  # a no-op keeps the logits
    session.rewind(0)
    assert session.tokens == [] and session.last_logits is None


def test_save_load_continue_is_identical(engine, tokens, tmp_path: Path) -> None:
    session = engine.new_session(128)
    session.eval(tokens[:70])
    path = tmp_path / "s.bin"
    with path.open("wb") as f:
        written = session.save(f)
    assert path.stat().st_size == written
    loaded = engine.new_session(100)
    with path.open("rb") as f:
        loaded.load(f)
    assert loaded.tokens == session.tokens
    np.testing.assert_array_equal(loaded.compute_logits(), session.compute_logits())
    session.eval(tokens[70:80])
    loaded.eval(tokens[70:80])
    np.testing.assert_array_equal(loaded.compute_logits(), session.compute_logits())


def payload(engine, tokens: list[int]) -> bytes:
    session = engine.new_session(len(tokens))
    session.eval(tokens)
    buf = io.BytesIO()
    session.save(buf)
    return buf.getvalue()


def test_load_refuses_foreign_oversized_and_truncated_payloads(engine, tokens) -> None:
    data = payload(engine, tokens[:40])
    session = engine.new_session(64)
    session.eval(tokens[:3])
    foreign = bytearray(data)
    foreign[12] ^= 0xFF  # inside the model fingerprint
    cases = {
        "different model": bytes(foreign),
        "bad magic": b"X" + data[1:],
        "truncated": data[: len(data) // 2],
    }
    for expected, blob in cases.items():
        with pytest.raises(EngineError, match=expected):
            session.load(io.BytesIO(blob))
    small = engine.new_session(39)
    with pytest.raises(EngineError, match="more than n_ctx"):
        small.load(io.BytesIO(data))
    assert small.tokens == []
    # The header is little-endian: magic, version, then the fingerprint; the KV type last.
    magic, version = struct.unpack_from("<8sI", data)
    assert (magic, version) == (b"DS4DSESS", 2)
    assert data[68:76] == engine.kv_type.encode().ljust(8, b"\0")


def test_on_chunk_can_stop_a_prefill_cleanly(engine, tokens) -> None:
    long = (tokens * 20)[:600]
    assert len(long) == 600
    calls: list[tuple[int, int]] = []

    def stop(done: int, total: int) -> None:
        calls.append((done, total))
        raise Cancelled

    session = engine.new_session(600)
    with pytest.raises(Cancelled):
        session.eval(long, on_chunk=stop)
    assert calls == [(256, 600)]
    assert session.tokens == long[:256]
    fresh = engine.new_session(600)
    fresh.eval(long[:256])
    np.testing.assert_array_equal(session.compute_logits(), fresh.compute_logits())
    # ... and the session goes on from there.
    seen: list[tuple[int, int]] = []
    session.eval(long[256:], on_chunk=lambda d, t: seen.append((d, t)))
    assert seen == [(256, 344)] and session.tokens == long


def test_context_full_and_bad_tokens_leave_the_session_unchanged(engine, tokens) -> None:
    session = engine.new_session(8)
    session.eval(tokens[:5])
    before = session.compute_logits().copy()
    with pytest.raises(ContextFullError):
        session.eval(tokens[5:9])
    with pytest.raises(EngineError, match="outside the vocabulary"):
        session.eval([1, 49152])
    with pytest.raises(EngineError, match="outside the vocabulary"):
        session.eval([-1])
    assert session.tokens == tokens[:5]
    np.testing.assert_array_equal(session.compute_logits(), before)
    session.eval(tokens[5:8])
    assert session.tokens == tokens[:8]


def test_sessions_in_parallel_threads_match_sequential(engine, tokens) -> None:
    """Worker threads (as the daemon uses) share the engine: calls are serialized."""
    import threading

    halves = [tokens[:40], tokens[20:60]]
    sequential = []
    for part in halves:
        s = engine.new_session(64)
        s.eval(part)
        for _ in range(3):
            s.eval([int(np.argmax(s.compute_logits()))])
        sequential.append((s.tokens, s.compute_logits().copy()))
    results: list = [None, None]

    def work(i: int) -> None:
        s = engine.new_session(64)
        s.eval(halves[i])
        for _ in range(3):
            s.eval([int(np.argmax(s.compute_logits()))])
        results[i] = (s.tokens, s.compute_logits().copy())

    threads = [threading.Thread(target=work, args=(i,)) for i in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    for (want_tokens, want_logits), (got_tokens, got_logits) in zip(
        sequential, results, strict=True
    ):
        assert got_tokens == want_tokens
        np.testing.assert_array_equal(got_logits, want_logits)


def test_closed_engine_refuses_work(model_path: Path) -> None:
    e = Engine.open(model_path, threads=1)
    session = e.new_session(16)
    session.eval([1, 2, 3])
    e.close()
    with pytest.raises(EngineError, match="closed"):
        session.eval([4])
    session.close()


def test_eval_batch_matches_each_session_alone(engine, tokens) -> None:
    """Greedy decode of three sessions advanced together equals each one decoded alone,
    bit for bit; a bad step refuses the whole batch before any session changes."""
    prompts = [tokens[:12], tokens[5:30], tokens[40:47]]
    alone = []
    for p in prompts:
        s = engine.new_session(64)
        s.eval(p)
        for _ in range(4):
            s.eval([int(np.argmax(s.compute_logits()))])
        alone.append((s.tokens, s.compute_logits().copy()))
    sessions = [engine.new_session(64) for _ in prompts]
    for s, p in zip(sessions, prompts, strict=True):
        s.eval(p)
    for _ in range(4):
        engine.eval_batch([(s, [int(np.argmax(s.compute_logits()))]) for s in sessions])
    for s, (want_tokens, want_logits) in zip(sessions, alone, strict=True):
        assert s.tokens == want_tokens
        np.testing.assert_array_equal(s.compute_logits(), want_logits)
    held = [s.tokens for s in sessions]
    with pytest.raises(EngineError, match="outside the vocabulary"):
        engine.eval_batch([(sessions[0], [1]), (sessions[1], [49152])])
    with pytest.raises(EngineError, match="twice"):
        engine.eval_batch([(sessions[0], [1]), (sessions[0], [2])])
    small = engine.new_session(4)
    small.eval(tokens[:4])
    with pytest.raises(ContextFullError):
        engine.eval_batch([(sessions[0], [1]), (small, [2])])
    assert [s.tokens for s in sessions] == held


# -- snapshots and delta payloads ---------------------------------------------------------


@pytest.fixture(scope="module")
def story(data_dir: Path) -> list[int]:
    case = json.loads((data_dir / "vectors/smollm2/long_story_2k.json").read_text())
    assert len(case["prompt_tokens"]) >= 120
    return case["prompt_tokens"][:120]


def write(snap) -> bytes:
    buf = io.BytesIO()
    assert snap.write(buf) == snap.nbytes
    return buf.getvalue()


def test_full_snapshot_is_the_saved_payload_and_survives_later_evals(engine, story) -> None:
    session = engine.new_session(128)
    session.eval(story[:60])
    saved = io.BytesIO()
    session.save(saved)
    snap = session.snapshot()
    # The snapshot is a copy: changing the session afterwards does not change it.
    session.rewind(20)
    session.eval(story[80:120])
    assert not snap.is_delta and write(snap) == saved.getvalue()


def test_delta_chain_loads_to_the_same_state_as_one_full_payload(engine, story) -> None:
    session = engine.new_session(128)
    session.eval(story[:40])
    base = write(session.snapshot())
    session.eval(story[40:70])
    delta1 = session.snapshot(start=40)
    session.eval(story[70:90])
    delta2 = write(session.snapshot(start=70))
    d1 = write(delta1)
    # Only the new rows: 30 tokens' KV, not 70.
    row = engine.model.kv_token_bytes(engine.kv_type)
    assert delta1.kv_len == 30 * row and len(d1) < len(base)
    assert struct.unpack_from("<8s", d1) == (b"DS4DDELT",)
    loaded = engine.new_session(100)
    for blob in (base, d1, delta2):
        loaded.load(io.BytesIO(blob))
    assert loaded.tokens == session.tokens == story[:90]
    np.testing.assert_array_equal(loaded.compute_logits(), session.compute_logits())
    full = io.BytesIO()
    session.save(full)
    again = io.BytesIO()
    loaded.save(again)
    assert again.getvalue() == full.getvalue()
    session.eval(story[90:95])
    loaded.eval(story[90:95])
    np.testing.assert_array_equal(loaded.compute_logits(), session.compute_logits())


def test_delta_refused_unless_the_session_holds_exactly_its_base(engine, story) -> None:
    session = engine.new_session(128)
    session.eval(story[:40])
    session.eval(story[40:60])
    delta = write(session.snapshot(start=40))
    other = engine.new_session(128)
    other.eval(story[:39] + [story[39] + 1])  # same length, one different token
    with pytest.raises(EngineError, match="other tokens"):
        other.load(io.BytesIO(delta))
    assert len(other.tokens) == 40  # still its own tokens
    short = engine.new_session(128)
    short.eval(story[:30])
    with pytest.raises(EngineError, match="extends 40 tokens; the session holds 30"):
        short.load(io.BytesIO(delta))
    with pytest.raises(EngineError, match="extends 40 tokens; the session holds 0"):
        engine.new_session(128).load(io.BytesIO(delta))
    small = engine.new_session(50)
    small.eval(story[:40])
    with pytest.raises(EngineError, match="does not fit n_ctx 50"):
        small.load(io.BytesIO(delta))
    base = engine.new_session(128)
    base.eval(story[:40])
    with pytest.raises(EngineError, match="truncated"):
        base.load(io.BytesIO(delta[: len(delta) - 100]))
    # A failed delta leaves the base usable: the same logits as a fresh session's.
    assert base.tokens == story[:40]
    fresh = engine.new_session(128)
    fresh.eval(story[:40])
    np.testing.assert_array_equal(base.compute_logits(), fresh.compute_logits())
    bad = bytearray(delta)
    struct.pack_into("<i", bad, struct.calcsize("<8sI32sQQIIQ32s"), -5)  # first new token
    good = engine.new_session(128)
    good.eval(story[:40])
    with pytest.raises(EngineError, match="outside the vocabulary"):
        good.load(io.BytesIO(bytes(bad)))
    good.load(io.BytesIO(delta))
    assert good.tokens == story[:60]


def test_snapshot_bounds_and_native_row_ranges_are_checked(engine, story) -> None:
    from ds4d.engine.native import lib

    session = engine.new_session(64)
    session.eval(story[:10])
    with pytest.raises(EngineError, match="cannot snapshot from token 11"):
        session.snapshot(start=11)
    with pytest.raises(EngineError):
        session.snapshot(start=-1)
    empty = session.snapshot(start=10)  # no new rows: header, logits
    assert empty.kv_len == 0 and empty.is_delta
    other = engine.new_session(64)
    other.eval(story[:10])
    other.load(io.BytesIO(write(empty)))
    assert other.tokens == story[:10]
    handle = session._state.handle
    buf = np.zeros(3 * 64 * 64, np.float32)
    ptr = buf.ctypes.data_as(ctypes.POINTER(ctypes.c_float))
    # n_ctx 64: rows [0, 64) exist, [1, 65), [-1, 0) and a start past n_ctx do not.
    assert lib.ds4n_dec_session_kv_get(handle, 0, 0, 0, 64, ptr) == 0
    assert lib.ds4n_dec_session_kv_get(handle, 0, 0, 1, 64, ptr) == -1
    assert lib.ds4n_dec_session_kv_get(handle, 0, 1, -1, 1, ptr) == -1
    assert lib.ds4n_dec_session_kv_set(handle, 0, 1, 65, 0, ptr) == -1
    assert lib.ds4n_dec_session_kv_set(handle, 0, 1, 2**62, 2**62, ptr) == -1
    assert lib.ds4n_dec_session_kv_get(handle, 30, 0, 0, 1, ptr) == -1
    # Rows [3, 7) of a range read are rows 3..6 of the whole read (rows of the stored type).
    row = engine.model.kv_row_bytes(engine.kv_type)
    whole = np.zeros(3 * 10 * row, np.uint8)
    part = np.zeros(3 * 4 * row, np.uint8)
    for which in (0, 1):
        assert lib.ds4n_dec_session_kv_get(handle, 5, which, 0, 10, whole.ctypes.data) == 0
        assert lib.ds4n_dec_session_kv_get(handle, 5, which, 3, 4, part.ctypes.data) == 0
        np.testing.assert_array_equal(part.reshape(3, 4, row), whole.reshape(3, 10, row)[:, 3:7])


def test_deepseek4_snapshots_are_whole_states(tmp_path: Path) -> None:
    from ds4d.tools.synth import SYNTH_PARAMS, write_deepseek4

    path = tmp_path / "ds4.gguf"
    write_deepseek4(path, seed=3)
    toks = [int(t) for t in np.random.default_rng(2).integers(0, SYNTH_PARAMS.n_vocab, 40)]
    with Engine.open(path, threads=1) as ds4:
        session = ds4.new_session(64)
        session.eval(toks[:30])
        assert not session.supports_delta
        with pytest.raises(EngineError, match="cannot be saved as deltas"):
            session.snapshot(start=10)
        snap = session.snapshot()
        saved = io.BytesIO()
        session.save(saved)
        session.eval(toks[30:])
        assert write(snap) == saved.getvalue()
        loaded = ds4.new_session(64)
        loaded.load(io.BytesIO(saved.getvalue()))
        assert loaded.tokens == toks[:30]
