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
# (tests/test_kv_types.py measures what f16 and q8_0 add).


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


def test_scalar_kernels_match_simd(exact_engine, prompt) -> None:
    simd = exact_engine.new_session(128)
    simd_logits = simd.eval_all_logits(prompt[:70])
    previous = native.simd_level()
    try:
        native.set_simd("scalar")
        scalar = exact_engine.new_session(128)
        scalar_logits = scalar.eval_all_logits(prompt[:70])
    finally:
        native.set_simd(previous)
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


REPO = Path(__file__).resolve().parent.parent
CHECK_FLAGS = ["-std=c11", "-O2", "-Wall", "-Wextra", "-Wno-unused-parameter", "-Werror",
               f"-I{REPO / 'native'}"]  # fmt: skip


@pytest.mark.parametrize("arch", ["native", "aarch64"])
def test_attention_simd_kernels_match_scalar(arch: str, tmp_path: Path) -> None:
    """The AVX2 kernel here, the NEON one under qemu-user, against the scalar kernel."""
    import platform
    import shutil
    import subprocess

    native_dir = REPO / "native"
    check = REPO / "tests/reference/check_attention.c"
    exe = tmp_path / "check_attention"
    if arch == "aarch64":
        cc, qemu = shutil.which("aarch64-linux-gnu-gcc"), shutil.which("qemu-aarch64")
        if not cc or not qemu:
            pytest.skip("needs aarch64-linux-gnu-gcc and qemu-aarch64")
        cmd = [cc, "-static", *CHECK_FLAGS, str(native_dir / "attention_neon.c")]
        run = [qemu, str(exe)]
    else:
        if platform.machine() not in ("x86_64", "AMD64"):
            pytest.skip("the native SIMD check is for x86-64 (arm64 runs NEON natively)")
        cc = shutil.which("cc") or shutil.which("gcc")
        cmd = [cc, *CHECK_FLAGS, "-mavx2", "-mfma", "-mf16c", str(native_dir / "attention_avx2.c")]
        run = [str(exe)]
    subprocess.run([*cmd, str(native_dir / "attention.c"), str(check), "-o", str(exe), "-lm"],
                   check=True)  # fmt: skip
    result = subprocess.run(run, capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "SIMD vs scalar: max |diff|" in result.stdout
