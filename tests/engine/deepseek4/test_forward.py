"""deepseek4 forward pass on a synthetic GGUF: the C forward against the numpy reference
(teacher-forced over 600 tokens: past the 128-row window, 150 ratio-4 rows with indexer
top-k selection, 4 ratio-128 rows), chunked prefill against token-by-token decode, and
save -> load -> continue, rewind, through the real Engine/Session."""

from __future__ import annotations

import io

import numpy as np
import pytest

from ds4d.engine import EngineError
from ds4d.engine.engine import Engine
from ds4d.tools.synth import SYNTH_PARAMS, write_deepseek4
from tests.reference.deepseek4_ref import DS4Reference

N_TOKENS = 600
N_CTX = 1024


@pytest.fixture(scope="module")
def synth_path(tmp_path_factory):
    path = tmp_path_factory.mktemp("ds4fwd") / "synth.gguf"
    write_deepseek4(path, seed=11)
    return path


@pytest.fixture(scope="module")
def engine(synth_path):
    with Engine.open(synth_path, threads=1) as e:
        yield e


@pytest.fixture(scope="module")
def tokens():
    return [int(t) for t in np.random.default_rng(5).integers(0, SYNTH_PARAMS.n_vocab, N_TOKENS)]


@pytest.fixture(scope="module")
def decoded(engine, tokens):
    """Logits after every token, decoding one token per eval call (and the session)."""
    s = engine.new_session(N_CTX)
    out = []
    for t in tokens:
        s.eval([t])
        out.append(np.array(s.compute_logits()))
    return np.array(out), s


def test_engine_info(engine):
    assert engine.info.family == "deepseek4"
    assert engine.info.n_vocab == SYNTH_PARAMS.n_vocab
    assert engine.info.n_layer == 5


def test_c_forward_matches_numpy_reference(engine, decoded, tokens):
    ref = DS4Reference(engine.model.layout)
    st = ref.new_state()
    want = np.array([ref.step(st, t) for t in tokens])
    got, session = decoded
    # what the 600 tokens exercised, per layer (ratios 0, 0, 4, 128, 4)
    counts = [(int(ls.n_comp), int(ls.n_icomp)) for ls in session._state.layers()]
    assert counts == [(0, 0), (0, 0), (150, 150), (4, 0), (150, 150)]
    assert [len(ls.comp) for ls in st.layers] == [0, 0, 150, 4, 150]
    assert len(st.layers[2].icomp) > SYNTH_PARAMS.idx_top_k  # indexer top-k is selecting
    tol = 1e-3 * float(want.std())
    diff = np.abs(got - want).max(axis=1)
    assert diff.max() <= tol, f"worst position {int(diff.argmax())}: {diff.max()} > {tol}"
    assert (got.argmax(axis=1) == want.argmax(axis=1)).all()


def test_chunked_prefill_equals_decode(engine, decoded, tokens):
    want, _ = decoded
    tol = 1e-4 * float(want.std())
    s = engine.new_session(N_CTX)
    chunks = [0, 3, 130, 131, 400, N_TOKENS]  # odd sizes: blocks and windows split
    for a, b in zip(chunks, chunks[1:], strict=False):
        s.eval(tokens[a:b])
        assert np.abs(s.compute_logits() - want[b - 1]).max() <= tol
    whole = engine.new_session(N_CTX)
    all_logits = whole.eval_all_logits(tokens)
    assert np.abs(all_logits - want).max() <= tol


def test_save_load_continue_identical(engine, tokens, tmp_path):
    a = engine.new_session(N_CTX)
    a.eval(tokens[:300])
    path = tmp_path / "s.bin"
    with open(path, "wb") as f:
        a.save(f)
    b = engine.new_session(N_CTX)
    with open(path, "rb") as f:
        b.load(f)
    assert b.tokens == a.tokens
    assert np.array_equal(b.compute_logits(), a.compute_logits())
    for t in tokens[300:420]:
        a.eval([t])
        b.eval([t])
        assert np.array_equal(a.compute_logits(), b.compute_logits())
    # a payload saved after a load is the same bytes as the original path's
    buf_a, buf_b = io.BytesIO(), io.BytesIO()
    a.save(buf_a)
    b.save(buf_b)
    assert buf_a.getvalue() == buf_b.getvalue()


def test_truncated_payload_refused(engine, tokens):
    a = engine.new_session(N_CTX)
    a.eval(tokens[:40])
    buf = io.BytesIO()
    a.save(buf)
    b = engine.new_session(N_CTX)
    with pytest.raises(EngineError, match="truncated"):
        b.load(io.BytesIO(buf.getvalue()[:-100]))
    assert b.tokens == []


def test_rewind_replays_exactly(engine, decoded, tokens):
    want, _ = decoded
    tol = 1e-4 * float(want.std())
    s = engine.new_session(N_CTX)
    s.eval(tokens[:150])
    s.eval(tokens[150:260])  # a prefill call: the state snapshots its start (150)
    for t in tokens[260:300]:  # decode
        s.eval([t])
    s.rewind(200)
    assert s.tokens == tokens[:200]
    assert s._state.replayed == 50  # from the snapshot at 150, not from 0
    assert np.abs(s.compute_logits() - want[199]).max() <= tol
    s.eval(tokens[200:230])
    assert np.abs(s.compute_logits() - want[229]).max() <= tol
    s.eval(tokens[230:400])  # snapshot at 230; the replay below crosses pos 383 (ratio 128)
    s.rewind(390)
    assert s._state.replayed == 160
    s.eval(tokens[390:420])
    assert np.abs(s.compute_logits() - want[419]).max() <= tol
    s.rewind(100)  # before every snapshot but the one at 0
    assert s._state.replayed == 100
    s.eval(tokens[100:101])
    assert np.abs(s.compute_logits() - want[100]).max() <= tol


def test_q4_experts_match_reference(tmp_path):
    path = tmp_path / "q4.gguf"
    write_deepseek4(path, seed=12, experts="q4")
    toks = [int(t) for t in np.random.default_rng(6).integers(0, SYNTH_PARAMS.n_vocab, 40)]
    with Engine.open(path, threads=1) as e:
        got = e.new_session(64).eval_all_logits(toks)
        ref = DS4Reference(e.model.layout)
        st = ref.new_state()
        want = np.array([ref.step(st, t) for t in toks])
    assert np.abs(got - want).max() <= 1e-3 * float(want.std())


def test_indexer_selection_changes_attention(engine, tokens):
    """The reference's top-k selection is live: with top_k large enough to keep every
    ratio-4 row, logits agree until the 17th row appears (pos 67), then differ."""
    import dataclasses

    lay = engine.model.layout
    wide = dataclasses.replace(lay, params=dataclasses.replace(lay.params, idx_top_k=10**6))
    a, b = DS4Reference(lay), DS4Reference(wide)
    sa, sb = a.new_state(), b.new_state()
    diffs = [float(np.abs(a.step(sa, t) - b.step(sb, t)).max()) for t in tokens[:80]]
    assert max(diffs[:67]) == 0.0
    assert min(diffs[67:]) > 0.0


def test_two_threads_match_one(synth_path, engine, decoded, tokens):
    want, _ = decoded
    with Engine.open(synth_path, threads=2) as e2:
        got = e2.new_session(N_CTX).eval_all_logits(tokens[:200])
    assert np.abs(got - want[:200]).max() <= 1e-4 * float(want.std())
