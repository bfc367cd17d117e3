"""The native llama forward against the numpy reference, and its paths against each other
(chunked prefill vs token by token, SIMD vs scalar kernels, quant types and options the
embedded model does not use)."""

from __future__ import annotations

import io
import json
from pathlib import Path

import numpy as np
import pytest
from gguf import GGMLQuantizationType as Q

from ds4d.engine import llama as llama_family
from ds4d.engine import native
from ds4d.engine.gguf_file import GGUFFile
from tests.native.test_kernels import SIMD_LEVELS
from tests.reference.dense_ref import DenseReference
from tests.reference.tiny_llama import write_tiny_llama

# float32 activations in a different summation order than the reference: logits (of
# magnitude ~10-30) agree to a few 1e-4; the bound leaves room without hiding a bug
# (a wrong RoPE pair, mask or scale moves logits by whole units).
LOGIT_TOL = 5e-3


@pytest.fixture(scope="module")
def prompt(data_dir: Path) -> list[int]:
    case = json.loads((data_dir / "vectors/smollm2/chat_capital.json").read_text())
    return case["prompt_tokens"] + [s["token"] for s in case["steps"]]


# These compare the forward pass's paths at float32 tolerances: the exact f32 KV
# (tests/engine/test_kv_types.py measures what f16 and q8_0 add).


def test_prefill_then_decode_match_reference(exact_engine, model_path: Path, prompt) -> None:
    ref = DenseReference(GGUFFile(model_path), dtype=np.float32)
    n_prefill = 40
    session = exact_engine.new_session(64)
    got = session.eval_all_logits(prompt[:n_prefill])
    want = ref.forward(prompt[:n_prefill])
    assert np.abs(got - want).max() < LOGIT_TOL
    assert (got.argmax(axis=1) == want.argmax(axis=1)).all()
    for tok in prompt[n_prefill : n_prefill + 4]:
        session.eval([tok])
        want = ref.forward([tok])[-1]
        assert np.abs(session.compute_logits() - want).max() < LOGIT_TOL


def kv_rows(session) -> np.ndarray:
    buf = io.BytesIO()
    session._state.write_kv(buf, session.n_tokens)
    return np.frombuffer(buf.getvalue(), np.float32)


def test_chunked_prefill_equals_token_by_token(exact_engine, prompt) -> None:
    # 300 positions: a 256-token chunk and a partial one, many K tiles and key blocks,
    # and decode steps past 256 keys where attention splits the keys across threads.
    tokens = (prompt * 10)[:300]
    chunked = exact_engine.new_session(300)
    chunked.eval(tokens)
    stepped = exact_engine.new_session(300)
    for tok in tokens:
        stepped.eval([tok])
    assert np.abs(chunked.compute_logits() - stepped.compute_logits()).max() < LOGIT_TOL
    assert np.abs(kv_rows(chunked) - kv_rows(stepped)).max() < 1e-3


@pytest.mark.parametrize("level", SIMD_LEVELS, ids=[native.SIMD_NAMES[x] for x in SIMD_LEVELS])
def test_scalar_kernels_match_simd(exact_engine, prompt, level: int) -> None:
    """The whole forward with the scalar kernels against each SIMD set this CPU runs."""
    try:
        native.set_simd(level)
        simd = exact_engine.new_session(128)
        simd_logits = simd.eval_all_logits(prompt[:70])
        native.set_simd("scalar")
        scalar = exact_engine.new_session(128)
        scalar_logits = scalar.eval_all_logits(prompt[:70])
    finally:
        native.set_simd(native.SIMD_AUTO)
    assert np.abs(simd_logits - scalar_logits).max() < LOGIT_TOL


@pytest.mark.parametrize(
    "options",
    [
        {"matrix_type": Q.Q8_0, "biases": True, "untied_output": True, "rope_freqs": True},
        {"matrix_type": Q.Q4_0, "embd_type": Q.F16},
        {"matrix_type": Q.Q5_1, "embd_type": Q.F32, "untied_output": True},
        {"matrix_type": Q.F16, "embd_type": Q.Q8_0, "biases": True},
    ],
    ids=["q8_0-biases-untied-ropefreqs", "q4_0", "q5_1-untied", "f16-biases"],
)
def test_tiny_model_variants_match_reference(tmp_path: Path, options: dict) -> None:
    gf = GGUFFile(write_tiny_llama(tmp_path / "tiny.gguf", **options))
    ref = DenseReference(gf)
    tokens = np.random.default_rng(3).integers(0, gf.get("llama.vocab_size"), 90)
    with native.Pool(2) as pool:
        model = llama_family.load(gf, pool)
        state = model.new_state(128)
        logits = np.empty((80, model.n_vocab), np.float32)
        state.eval(tokens[:80].astype(np.int32), logits, all_logits=True)
        assert np.abs(logits - ref.forward(tokens[:80].tolist())).max() < 1e-3
        last = np.empty(model.n_vocab, np.float32)
        for tok in tokens[80:]:
            state.eval(np.array([tok], np.int32), last)
            assert np.abs(last - ref.forward([int(tok)])[-1]).max() < 1e-3
        state.close()
        model.close()
