"""The qwen3moe and gpt-oss forwards on tiny random GGUFs against the float64 numpy
reference; chunked prefill against token-by-token decode; save -> load -> continue through
the engine's Session; the expert-read counter of a decode token; malformed files refused."""

from __future__ import annotations

import io
from pathlib import Path

import numpy as np
import pytest
from gguf import GGMLQuantizationType as Q

from ds4d.engine import gptoss, native, qwen3moe
from ds4d.engine.engine import Engine, Session
from ds4d.engine.errors import ModelLoadError
from ds4d.engine.gguf_file import GGUFFile
from tests.reference.moe_model_ref import MoEModelReference
from tests.reference.tiny_moe import N_EXPERT, N_LAYER, N_VOCAB, write_tiny_moe

FAMILIES = {"qwen3moe": qwen3moe, "gpt-oss": gptoss}
# Tiny models in float32 against float64: logits of magnitude ~1 agree to ~1e-6.
TOL = 2e-5


def tiny(tmp_path: Path, arch: str, **options) -> GGUFFile:
    options.setdefault("n_used", 4 if arch == "gpt-oss" else 2)
    options.setdefault("head_dim", 16 if arch == "gpt-oss" else 32)
    return GGUFFile(write_tiny_moe(tmp_path / f"{arch}.gguf", arch, **options))


@pytest.fixture(scope="module")
def pool():
    with native.Pool(2) as p:
        yield p


def tokens(n: int, seed: int = 1) -> np.ndarray:
    return np.random.default_rng(seed).integers(0, N_VOCAB, n).astype(np.int32)


@pytest.mark.parametrize(
    "arch,options",
    [("qwen3moe", {}), ("qwen3moe", {"expert_type": Q.Q8_0, "matrix_type": Q.Q8_0,
                                     "tied_output": True}),
     ("qwen3moe", {"extra_keys": {"expert_weights_norm": False}}),
     ("qwen3moe", {"extra_keys": {"rope.scaling.type": "yarn", "rope.scaling.factor": 4.0,
                                  "rope.scaling.original_context_length": 64}}),
     ("gpt-oss", {}), ("gpt-oss", {"expert_type": Q.MXFP4, "matrix_type": Q.Q8_0}),
     ("gpt-oss", {"expert_type": Q.Q8_0, "matrix_type": Q.Q4_0})],
    ids=["qwen3moe", "qwen3moe-q8_0-tied", "qwen3moe-unnormalised", "qwen3moe-yarn", "gpt-oss",
         "gpt-oss-mxfp4", "gpt-oss-q8_0"],
)  # fmt: skip
def test_prefill_and_decode_match_reference(tmp_path: Path, pool, arch: str, options) -> None:
    """40 positions: gpt-oss's sliding window (8) is crossed many times on its even layers."""
    gf = tiny(tmp_path, arch, **options)
    ref = MoEModelReference(gf)
    toks = tokens(40)
    model = FAMILIES[arch].load(gf, pool)
    state = model.new_state(64)
    logits = np.empty((30, model.n_vocab), np.float32)
    state.eval(toks[:30], logits, all_logits=True)
    want = ref.forward(toks[:30].tolist())
    assert np.abs(logits - want).max() < TOL * max(1.0, np.abs(want).max())
    last = np.empty(model.n_vocab, np.float32)
    for tok in toks[30:]:
        state.eval(np.array([tok], np.int32), last)
        want = ref.forward([int(tok)])[-1]
        assert np.abs(last - want).max() < TOL * max(1.0, np.abs(want).max())
    state.close()
    model.close()


def test_the_sliding_window_is_in_effect(tmp_path: Path, pool) -> None:
    """The reference comparison above covers the window: over 40 positions, gpt-oss's last
    logits move when its layers are all made full-attention (pattern period 1)."""
    outs = []
    for pattern in (2, 1):
        (tmp_path / str(pattern)).mkdir()
        gf = tiny(tmp_path / str(pattern), "gpt-oss",
                  extra_keys={"attention.sliding_window_pattern": pattern})  # fmt: skip
        model = gptoss.load(gf, pool)
        assert model.sliding == [pattern == 2, False, pattern == 2]
        state = model.new_state(64)
        outs.append(np.empty(model.n_vocab, np.float32))
        state.eval(tokens(40), outs[-1])
        state.close()
        model.close()
    assert np.abs(outs[0] - outs[1]).max() > 1e-3


def engine_of(gf: GGUFFile, pool_threads: int = 2) -> Engine:
    module = FAMILIES[gf.architecture]
    pool = native.Pool(pool_threads)
    return Engine(gf, module, module.load(gf, pool), pool, None)


@pytest.mark.parametrize("arch", FAMILIES)
def test_chunked_prefill_equals_token_by_token(tmp_path: Path, arch: str, monkeypatch) -> None:
    from ds4d.engine import engine as engine_module

    monkeypatch.setattr(engine_module, "PREFILL_CHUNK", 16)  # 70 tokens: 5 chunks
    toks = tokens(70, seed=4).tolist()
    with engine_of(tiny(tmp_path, arch)) as eng:
        chunked, stepped = eng.new_session(80), eng.new_session(80)
        chunked.eval(toks)
        for tok in toks:
            stepped.eval([tok])
        assert np.abs(chunked.compute_logits() - stepped.compute_logits()).max() < 1e-5
        assert np.abs(kv_rows(chunked) - kv_rows(stepped)).max() < 1e-5


def kv_rows(session: Session) -> np.ndarray:
    buf = io.BytesIO()
    session._state.write_kv(buf, session.n_tokens)
    return np.frombuffer(buf.getvalue(), np.float32)


@pytest.mark.parametrize("arch", FAMILIES)
def test_save_load_continue_is_identical(tmp_path: Path, arch: str) -> None:
    toks = tokens(50, seed=7).tolist()
    with engine_of(tiny(tmp_path, arch)) as eng:
        session = eng.new_session(64)
        session.eval(toks[:40])
        buf = io.BytesIO()
        written = session.save(buf)
        assert written == len(buf.getvalue())
        loaded = eng.new_session(64)
        loaded.load(io.BytesIO(buf.getvalue()))
        assert loaded.tokens == session.tokens
        np.testing.assert_array_equal(loaded.compute_logits(), session.compute_logits())
        session.eval(toks[40:])
        loaded.eval(toks[40:])
        np.testing.assert_array_equal(loaded.compute_logits(), session.compute_logits())


@pytest.mark.parametrize("arch", FAMILIES)
def test_decode_reads_only_the_selected_experts(tmp_path: Path, pool, arch: str) -> None:
    """Per decode token and layer the session reads exactly n_used experts' weights; a
    prefill chunk reads each expert it uses once, however many of its tokens chose it."""
    gf = tiny(tmp_path, arch)
    model = FAMILIES[arch].load(gf, pool)
    names = [f"blk.0.ffn_{p}_exps.{k}" for p in ("gate", "up", "down") for k in ("weight", "bias")]
    per_expert = sum(gf.tensor(n).n_bytes for n in names if gf.has_tensor(n)) // N_EXPERT
    state = model.new_state(64)
    toks = tokens(33)
    state.eval(toks[:32], None)
    prefill = model.expert_bytes
    assert prefill <= N_LAYER * N_EXPERT * per_expert  # 32 tokens x n_used picks, each read once
    state.eval(toks[32:], None)
    decode = model.expert_bytes - prefill
    assert decode == N_LAYER * model.n_used * per_expert
    state.close()
    model.close()


@pytest.mark.parametrize(
    "arch,options,message",
    [("qwen3moe", {"override_shape": {"blk.1.ffn_up_exps.weight": (N_EXPERT, 32, 64)}},
      "blk.1.ffn_up_exps.weight has shape"),
     ("qwen3moe", {"drop": ("blk.2.attn_q_norm.weight",)}, "blk.2.attn_q_norm.weight"),
     ("qwen3moe", {"n_used": 9}, "9 experts used of 8"),
     ("qwen3moe", {"extra_keys": {"expert_gating_func": 2}}, "gating function 2"),
     ("gpt-oss", {"drop": ("blk.0.attn_sinks.weight",)}, "blk.0.attn_sinks.weight"),
     ("gpt-oss", {"override_shape": {"blk.0.ffn_down_exps.bias": (N_EXPERT, 32)}},
      "blk.0.ffn_down_exps.bias has shape"),
     ("gpt-oss", {"drop": ("output.weight",)}, "output.weight")],
    ids=["expert-shape", "missing-qnorm", "too-many-used", "gating", "missing-sinks",
         "bias-shape", "no-output"],
)  # fmt: skip
def test_malformed_files_are_refused_with_one_line(tmp_path: Path, pool, arch, options,
                                                   message) -> None:  # fmt: skip
    gf = tiny(tmp_path, arch, **options)
    with pytest.raises(ModelLoadError, match=message) as err:
        FAMILIES[arch].load(gf, pool)
    assert "\n" not in str(err.value)
