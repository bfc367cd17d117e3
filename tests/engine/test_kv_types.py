"""KV precision (--kv-type f32 | f16 | q8_0) on the real embedded model: bytes per token,
the session payload per type, the refusals, the half converter against numpy, and the
log-probability distance each type adds on the SmolLM2 exact vectors."""

from __future__ import annotations

import csv
import ctypes
import io
import json
import struct
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest

from ds4d.engine import Engine, EngineError
from ds4d.engine.native import lib
from tests.conftest import REPO

TYPES = ("f32", "f16", "q8_0")
# SmolLM2: 30 layers x (K + V) x 3 kv heads x 64 dims; q8_0 rows are 2 blocks of 34 bytes.
ROW_BYTES = {"f32": 64 * 4, "f16": 64 * 2, "q8_0": 2 * 34}
# Mean |Δ logprob| over every step's exact top-20, against the exact float32 forward.
BOUND = {"f32": 0.0005, "f16": 0.005, "q8_0": 0.1}
SHORT_CASES = ("chat_capital", "chat_redis", "raw_code")


@pytest.fixture(scope="module")
def engines(model_path: Path) -> Iterator[dict[str, Engine]]:
    opened = {t: Engine.open(model_path, threads=1, kv_type=t) for t in TYPES}
    yield opened
    for e in opened.values():
        e.close()


def test_default_engine_uses_f16(engine) -> None:
    assert engine.kv_type == "f16" and engine.info.kv_type == "f16"


@pytest.mark.parametrize("kv_type", TYPES)
def test_kv_bytes_follow_the_type(engines, kv_type: str) -> None:
    """Resident bytes (100 positions, padded to 128) and payload bytes per token: f16 half
    of f32, q8_0 34/128 of it."""
    session = engines[kv_type].new_session(100)
    per_token = 30 * 2 * 3 * ROW_BYTES[kv_type]
    assert session.kv_bytes == per_token * 128
    session.eval([1, 2, 3, 4, 5])
    buf = io.BytesIO()
    written = session.save(buf)
    assert written == len(buf.getvalue())
    # header, 5 tokens, the logits, then exactly the KV rows in the stored type
    assert written == 76 + 4 * 5 + 4 * 49152 + 5 * per_token
    session.close()


def test_f16_halves_and_q8_0_quarters_the_kv(engines) -> None:
    sizes = {t: engines[t].new_session(64).kv_bytes for t in TYPES}
    assert sizes["f16"] * 2 == sizes["f32"]
    assert sizes["q8_0"] * 128 == sizes["f32"] * 34
    # what `ds4d bench --profile` counts as attention's reads per step
    from ds4d.tools.bench_profile import kv_bytes_read

    read = {t: kv_bytes_read(engines[t].model, 1000, t) for t in TYPES}
    assert read["f32"] == 2 * read["f16"] == 1000 * 30 * 2 * 3 * 256


@pytest.mark.parametrize("kv_type", TYPES)
def test_save_load_round_trip_continues_identically(engines, kv_type: str) -> None:
    """A loaded session holds the same KV bytes: it continues exactly like the original."""
    e = engines[kv_type]
    prompt = [1, 9690, 198, 2683, 359, 253, 5356, 5646, 11173, 3365, 3511, 314, 1945, 3149]
    a = e.new_session(64)
    a.eval(prompt)
    buf = io.BytesIO()
    a.save(buf)
    b = e.new_session(64)
    b.load(io.BytesIO(buf.getvalue()))
    assert b.tokens == a.tokens
    again = io.BytesIO()
    b.save(again)
    assert again.getvalue() == buf.getvalue()
    for tok in (28, 4521, 349, 17):
        a.eval([tok])
        b.eval([tok])
        np.testing.assert_array_equal(a.compute_logits(), b.compute_logits())


def test_payload_of_another_kv_type_is_refused(engines) -> None:
    src = engines["f16"].new_session(32)
    src.eval([1, 2, 3])
    buf = io.BytesIO()
    src.save(buf)
    dst = engines["f32"].new_session(32)
    dst.eval([7, 8])
    with pytest.raises(EngineError, match="f16 KV; this engine uses f32"):
        dst.load(io.BytesIO(buf.getvalue()))


def test_version_1_payload_is_refused_cleanly(engines) -> None:
    """A payload of the previous format (f32 rows, no KV type) names its version."""
    e = engines["f32"]
    old = struct.pack("<8sI32sQIIQ", b"DS4DSESS", 1, bytes.fromhex(e.info.fingerprint), 0,
                      e.info.n_vocab, 0, 0)  # fmt: skip
    with pytest.raises(EngineError, match="version 1 is not supported"):
        e.new_session(8).load(io.BytesIO(old))


def test_unknown_kv_type_and_q8_0_on_a_16_dim_head_are_refused(model_path: Path) -> None:
    from tests.helpers.kit import kit_model

    with pytest.raises(EngineError, match="unknown KV type 'q4'"):
        Engine.open(model_path, threads=1, kv_type="q4")
    # The kit llama has head_dim 16: not a whole q8_0 block.
    with pytest.raises(EngineError, match="multiple of 32; this model's is 16"):
        Engine.open(kit_model("llama"), threads=1, kv_type="q8_0")
    with Engine.open(kit_model("llama"), threads=1, kv_type="f16") as e:
        e.new_session(8).eval([1, 2])


def test_f32_to_f16_rounds_like_numpy() -> None:
    """The scalar converter every store uses: round to nearest even, subnormals, overflow
    to inf, signed zero, nan."""
    fn = lib.ds4n_f32_to_f16
    fn.restype, fn.argtypes = ctypes.c_uint16, [ctypes.c_float]
    rng = np.random.default_rng(3)
    values = np.concatenate([
        rng.standard_normal(3000).astype(np.float32) * np.float32(10.0) ** rng.integers(-9, 6, 3000),
        # halfway cases between halves, at several exponents, subnormal and normal
        (np.arange(1, 200, dtype=np.float32) + np.float32(0.5)) * np.float32(2.0**-24),
        (np.arange(1024, 1200, dtype=np.float32) + np.float32(0.5)) * np.float32(2.0**-10),
        np.array([0.0, -0.0, 65504.0, 65519.0, 65520.0, 1e9, -1e9, np.inf, -np.inf,
                  2.0**-25, 2.0**-25 * 1.0001, 2.0**-14, 6.1e-5], np.float32),
    ]).astype(np.float32)  # fmt: skip
    got = np.array([fn(float(v)) for v in values], np.uint16)
    want = values.astype(np.float16).view(np.uint16)
    np.testing.assert_array_equal(got, want)
    assert np.isnan(np.array([fn(float("nan"))], np.uint16).view(np.float16)[0])


def test_f32_to_f16_rows_are_bitwise_the_scalar_converter() -> None:
    """The KV store's row conversion (F16C on x86) against the scalar converter, at every
    SIMD level, contiguous and strided (a K tile's lanes), with lengths ending in a tail:
    halfway cases, subnormals, the overflow edge, infinities, signed zeros, nans with
    payloads and random bit patterns over the whole float range."""
    from ds4d.engine import native
    from tests.native.test_kernels import LEVELS

    one = lib.ds4n_f32_to_f16
    one.restype, one.argtypes = ctypes.c_uint16, [ctypes.c_float]
    rows = lib.ds4n_f32_to_f16_n
    rows.restype = None
    rows.argtypes = [ctypes.c_void_p, ctypes.c_int, ctypes.c_void_p, ctypes.c_int64]
    rng = np.random.default_rng(4)
    bits = np.concatenate([
        rng.integers(0, 2**32, 4000, dtype=np.uint64).astype(np.uint32),
        np.array([0x7F800001, 0xFF800001, 0x7FC00000, 0x7FBFFFFF, 0x7FFFE000, 0x7F802000,
                  0x477FEFFF, 0x477FF000, 0x33000000, 0x33000001, 0x387FF000, 0x38800000],
                 np.uint32),
    ])  # fmt: skip
    values = np.concatenate([
        bits.view(np.float32),
        (np.arange(1, 200, dtype=np.float32) + np.float32(0.5)) * np.float32(2.0**-24),
        (np.arange(1024, 1200, dtype=np.float32) + np.float32(0.5)) * np.float32(2.0**-10),
        np.array([0.0, -0.0, 65504.0, 65519.0, 65520.0, np.inf, -np.inf], np.float32),
    ]).astype(np.float32)  # fmt: skip
    want = np.array([one(float(v)) for v in values], np.uint16)
    for level in LEVELS:
        native.set_simd(level)
        try:
            for n, stride in ((len(values), 1), (len(values) - 5, 3), (13, 1), (7, 64)):
                out = np.zeros(n * stride, np.uint16)
                rows(values.ctypes.data, n, out.ctypes.data, stride)
                assert out[::stride].tobytes() == want[:n].tobytes(), (level, n, stride)
                assert not out.reshape(n, stride)[:, 1:].any()
        finally:
            native.set_simd(native.SIMD_AUTO)


def _mean_distance(engine: Engine, exact: dict) -> float:
    steps = exact["steps"]
    session = engine.new_session(len(exact["prompt_tokens"]) + len(steps))
    session.eval(exact["prompt_tokens"])
    diffs = []
    for step in steps:
        x = session.compute_logits().astype(np.float64)
        x -= x.max()
        ours = x - np.log(np.exp(x).sum())
        ids = np.array([t for t, _ in step["top"]])
        diffs.append(np.abs(ours[ids] - np.array([lp for _, lp in step["top"]])).mean())
        session.eval([step["token"]])
    session.close()
    return float(np.mean(diffs))


@pytest.mark.timeout(600)
def test_logprob_distance_of_each_kv_type(engines, data_dir: Path) -> None:
    """Teacher-forced over the short SmolLM2 cases: the distance each KV type adds to the
    exact float32 forward, printed, and bounded (f16 at most 0.005)."""
    vectors = data_dir / "vectors/smollm2"
    means: dict[str, list[float]] = {t: [] for t in TYPES}
    for case in SHORT_CASES:
        exact = json.loads((vectors / f"{case}.exact.json").read_text())
        for t in TYPES:
            means[t].append(_mean_distance(engines[t], exact))
    for t in TYPES:
        print(f"kv {t}: mean |Δ logprob| {np.mean(means[t]):.5f} over {', '.join(SHORT_CASES)}"
              f" (per case {', '.join(f'{m:.5f}' for m in means[t])})")  # fmt: skip
    for t in TYPES:
        assert np.mean(means[t]) <= BOUND[t], t
    # Each coarser type is further from exact than the finer one.
    assert np.mean(means["f32"]) < np.mean(means["f16"]) < np.mean(means["q8_0"])


def test_config_knows_the_engine_kv_types() -> None:
    from ds4d.daemon.config import KV_CHOICES, KV_TYPES, Config
    from ds4d.engine.decoder import KV_TYPES as ENGINE_KV_TYPES

    assert KV_TYPES == tuple(ENGINE_KV_TYPES)
    assert KV_CHOICES == ("auto", *KV_TYPES)
    assert Config().kv_type == "auto"


def _ds4d(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "ds4d", *args], cwd=REPO, capture_output=True,
                          text=True, timeout=240)  # fmt: skip


def test_cli_kv_type_flag(tmp_path: Path) -> None:
    """`ds4d bench --kv-type`: the f32 sweep holds twice the KV bytes of the f16 one;
    `ds4d generate --kv-type q8_0` on a model with 16-dim heads is one clear line."""
    from tests.helpers.kit import kit_model

    prompt = tmp_path / "prompt.txt"
    prompt.write_text("Quel ramo del lago di Como, che volge a mezzogiorno. " * 20)
    kv = {}
    for t in ("f32", "f16"):
        out = tmp_path / f"{t}.csv"
        r = _ds4d("bench", "--prompt-file", str(prompt), "--ctx-start", "64", "--ctx-max", "64",
                  "--step-incr", "64", "--gen-tokens", "2", "--threads", "1", "--kv-type", t,
                  "--csv", str(out))  # fmt: skip
        assert r.returncode == 0, r.stderr
        assert f"kv {t}" in r.stdout
        kv[t] = int(next(csv.DictReader(out.open()))["kv_bytes"])
    assert kv["f32"] == 2 * kv["f16"]
    r = _ds4d("generate", "-m", str(kit_model("llama")), "--kv-type", "q8_0", "-p", "hi")
    assert r.returncode != 0
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and "multiple of 32" in lines[0], r.stderr


def test_deepseek4_keeps_its_own_kv_whatever_the_kv_type(tmp_path: Path) -> None:
    """DeepSeek V4's compressed cache has one layout: kv_type is ignored there (reported as
    "native"), and its payload round-trips as before."""
    from ds4d.tools.synth import write_deepseek4

    path = tmp_path / "synth.gguf"
    write_deepseek4(path, seed=4)
    with Engine.open(path, threads=1, kv_type="q8_0") as e:
        assert e.kv_type == "native" and e.info.kv_type == "native"
        a = e.new_session(32)
        a.eval([1, 2, 3, 4])
        buf = io.BytesIO()
        a.save(buf)
        assert buf.getvalue()[68:76] == b"native\0\0"
        b = e.new_session(32)
        b.load(io.BytesIO(buf.getvalue()))
        a.eval([5])
        b.eval([5])
        np.testing.assert_array_equal(a.compute_logits(), b.compute_logits())
