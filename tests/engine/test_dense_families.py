"""The dense families (qwen2, qwen3, gemma3, phi3 — and llama through the same checks) on
tiny random GGUFs against the float64 numpy reference (tests/reference/dense_ref.py):
prefill and decode logits, chunked prefill against token-by-token, save -> load ->
continue, sliding windows crossed, and malformed files refused with one line."""

from __future__ import annotations

import importlib
import io
from pathlib import Path

import numpy as np
import pytest
from gguf import GGMLQuantizationType as Q

from ds4d.engine import native
from ds4d.engine.engine import FAMILIES
from ds4d.engine.errors import ModelLoadError
from ds4d.engine.gguf_file import GGUFFile
from tests.native.test_kernels import SIMD_LEVELS
from tests.reference.dense_ref import DenseReference
from tests.reference.tiny_dense import N_VOCAB, write_tiny

TOL = 1e-3
N_CTX = 160

CASES = {
    "llama-yarn": dict(arch="llama", yarn_factor=8.0),
    "llama-biases-q8_0": dict(arch="llama", biases=True, matrix_type=Q.Q8_0),
    "qwen2": dict(arch="qwen2"),
    "qwen2-q8_0-tied": dict(arch="qwen2", matrix_type=Q.Q8_0, untied_output=False),
    "qwen3": dict(arch="qwen3", head_dim=32),
    "qwen3-linear-rope": dict(arch="qwen3", linear_scale=4.0),
    "gemma3": dict(arch="gemma3", n_layer=7, window=24, softcap=30.0, untied_output=False),
    "gemma3-no-window": dict(arch="gemma3", head_dim=32),
    "phi3": dict(arch="phi3"),
    "phi3-longrope": dict(arch="phi3", rope_factors=True),
    # a session context beyond the original one (1024) takes the long factors
    "phi3-longrope-long-context": dict(arch="phi3", rope_factors=True, n_ctx=2048),
    # a head of 64 + 48 values: the vector kernels' P·V spans of 4 and of 3 vectors
    "qwen3-head-112": dict(arch="qwen3", head_dim=112),
}


def load(gf: GGUFFile, pool: native.Pool):
    return importlib.import_module(FAMILIES[gf.architecture]).load(gf, pool)


@pytest.fixture(scope="module")
def pool():
    with native.Pool(2) as p:
        yield p


def tokens(n: int, seed: int = 3) -> np.ndarray:
    return np.random.default_rng(seed).integers(0, N_VOCAB, n).astype(np.int32)


def eval_all(state, toks: np.ndarray) -> np.ndarray:
    out = np.empty((len(toks), N_VOCAB), np.float32)
    state.eval(np.ascontiguousarray(toks), out, all_logits=True)
    return out


@pytest.mark.parametrize("case", sorted(CASES))
def test_prefill_and_decode_match_reference(case: str, tmp_path: Path, pool) -> None:
    opts = dict(CASES[case])
    n_ctx = opts.pop("n_ctx", N_CTX)
    gf = GGUFFile(write_tiny(tmp_path / "m.gguf", **opts))
    ref = DenseReference(gf, n_ctx=n_ctx)
    model = load(gf, pool)
    state = model.new_state(n_ctx)
    toks = tokens(110)
    # Prefill in uneven chunks (windows start mid-chunk), then decode one at a time.
    pos = 0
    for end in (37, 80):
        np.testing.assert_allclose(eval_all(state, toks[pos:end]),
                                   ref.forward(toks[pos:end].tolist()), atol=TOL, rtol=0)  # fmt: skip
        pos = end
    last = np.empty(N_VOCAB, np.float32)
    for t in toks[80:]:
        state.eval(np.array([t], np.int32), last)
        np.testing.assert_allclose(last, ref.forward([int(t)])[-1], atol=TOL, rtol=0)
    state.close()
    model.close()


def kv_rows(state, n: int) -> bytes:
    buf = io.BytesIO()
    state.write_kv(buf, n)
    return buf.getvalue()


@pytest.mark.parametrize("case", ["qwen2", "qwen3", "gemma3", "phi3"])
def test_chunked_prefill_equals_token_by_token(case: str, tmp_path: Path, pool) -> None:
    gf = GGUFFile(write_tiny(tmp_path / "m.gguf", **CASES[case]))
    model = load(gf, pool)
    toks = tokens(70)
    chunked, stepped = model.new_state(N_CTX), model.new_state(N_CTX)
    a = eval_all(chunked, toks)[-1]
    last = np.empty(N_VOCAB, np.float32)
    for t in toks:
        stepped.eval(np.array([t], np.int32), last)
    assert np.abs(a - last).max() < 1e-4
    ka = np.frombuffer(kv_rows(chunked, 70), np.float32)
    kb = np.frombuffer(kv_rows(stepped, 70), np.float32)
    assert np.abs(ka - kb).max() < 1e-4
    model.close()


@pytest.mark.parametrize("case", ["qwen2", "qwen3", "gemma3", "phi3"])
def test_save_load_continue_is_identical(case: str, tmp_path: Path, pool) -> None:
    gf = GGUFFile(write_tiny(tmp_path / "m.gguf", **CASES[case]))
    model = load(gf, pool)
    toks = tokens(90)
    first = model.new_state(N_CTX)
    eval_all(first, toks[:60])
    payload = kv_rows(first, 60)
    assert len(payload) == first.kv_payload_bytes(60)
    second = model.new_state(N_CTX)
    second.read_kv(io.BytesIO(payload), 60)
    assert second.n_past == 60  # read_kv leaves the state holding the rows it read
    np.testing.assert_array_equal(eval_all(first, toks[60:]), eval_all(second, toks[60:]))
    model.close()


def test_window_is_really_applied(tmp_path: Path, pool) -> None:
    """gemma3's local layers: a token far outside every window changes nothing but the
    global layers; with the global layer removed (5 layers, all local), nothing at all."""
    gf = GGUFFile(write_tiny(tmp_path / "m.gguf", arch="gemma3", n_layer=5, window=8))
    model = load(gf, pool)
    toks = tokens(60)
    other = toks.copy()
    other[0] = (other[0] + 1) % N_VOCAB
    a, b = model.new_state(N_CTX), model.new_state(N_CTX)
    la, lb = eval_all(a, toks), eval_all(b, other)
    assert np.abs(la[:8] - lb[:8]).max() > 1e-3  # inside the window of token 0
    # Each layer reaches 7 positions further back: after 5, positions from 36 on are out of reach.
    np.testing.assert_array_equal(la[36:], lb[36:])
    model.close()


BAD = [
    ("qwen3", dict(drop=("blk.1.attn_k_norm.weight",)), "attn_k_norm"),
    ("qwen2", dict(override_shape={"blk.0.attn_q.bias": (8,)}), "attn_q.bias"),
    ("gemma3", dict(drop=("blk.0.post_ffw_norm.weight",)), "post_ffw_norm"),
    ("phi3", dict(override_shape={"blk.0.ffn_up.weight": (96, 64)}), "ffn_up"),
]


@pytest.mark.parametrize(("arch", "opts", "word"), BAD, ids=[b[0] for b in BAD])
def test_malformed_files_are_refused_in_one_line(arch, opts, word, tmp_path: Path, pool) -> None:
    gf = GGUFFile(write_tiny(tmp_path / "m.gguf", arch, **opts))
    with pytest.raises(ModelLoadError) as err:
        load(gf, pool)
    assert word in str(err.value) and "\n" not in str(err.value)


@pytest.mark.parametrize("level", SIMD_LEVELS, ids=[native.SIMD_NAMES[x] for x in SIMD_LEVELS])
@pytest.mark.parametrize("case", ["gemma3", "phi3", "qwen3", "qwen3-head-112"])
def test_scalar_kernels_match_simd(case: str, level: int, tmp_path: Path, pool) -> None:
    """The whole forward (GeGLU, windows, fused tensors; heads of 16, 32 and 112 values) with
    the scalar kernels against each SIMD set this CPU runs."""
    gf = GGUFFile(write_tiny(tmp_path / "m.gguf", **CASES[case]))
    model = load(gf, pool)
    toks = tokens(70)
    try:
        native.set_simd(level)
        simd = eval_all(model.new_state(N_CTX), toks)
        native.set_simd("scalar")
        scalar = eval_all(model.new_state(N_CTX), toks)
    finally:
        native.set_simd(native.SIMD_AUTO)
    assert np.abs(simd - scalar).max() < 1e-4
    model.close()


def test_decoder_attention_split_keys_windows_sinks(tmp_path: Path) -> None:
    """tests/reference/check_decoder.c, linked against the built library: the attention
    step's decode plan (split keys and their merge) with windows and sinks, against the
    definition."""
    import shutil
    import subprocess

    repo = Path(__file__).resolve().parents[2]
    build = native.library_path().parent
    exe = tmp_path / "check_decoder"
    cc = shutil.which("cc") or shutil.which("gcc")
    subprocess.run(
        [cc, "-std=c11", "-O2", "-Wall", "-Wextra", "-Wno-unused-parameter", "-Werror",
         f"-I{repo / 'native'}", str(repo / "tests/reference/check_decoder.c"), "-o", str(exe),
         f"-L{build}", "-lds4n", f"-Wl,-rpath,{build}", "-lm"],
        check=True,
    )  # fmt: skip
    result = subprocess.run([str(exe)], capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "vs definition: max |diff|" in result.stdout


def test_engine_session_save_load_rewind_on_a_kit_model(tmp_path: Path) -> None:
    """Through the Engine and Session API (payload file, rewind) on the kit's phi3 (the
    quickest kit model to open): a loaded session continues exactly like the original,
    and a rewound one like a fresh one."""
    from ds4d.engine import Engine
    from tests.helpers.kit import kit_model, kit_reference

    toks = [int(t) for t in kit_reference("phi3")[0].tokens[:90]]
    with Engine.open(kit_model("phi3"), threads=2) as engine:
        first = engine.new_session(128)
        first.eval(toks[:60])
        with open(tmp_path / "s.bin", "wb") as f:
            first.save(f)
        loaded = engine.new_session(128)
        with open(tmp_path / "s.bin", "rb") as f:
            loaded.load(f)
        np.testing.assert_array_equal(loaded.compute_logits(), first.compute_logits())
        first.eval(toks[60:])
        loaded.eval(toks[60:])
        np.testing.assert_array_equal(loaded.compute_logits(), first.compute_logits())
        first.rewind(40)
        first.eval(toks[40:70])
        fresh = engine.new_session(128)
        fresh.eval(toks[:70])
        assert np.abs(first.compute_logits() - fresh.compute_logits()).max() < 1e-4
