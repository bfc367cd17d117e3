"""Native row kernels (dequantize, dot) of every type against the gguf package's dequantizer
and float64 numpy, at every SIMD level this CPU has."""

from __future__ import annotations

import os
import subprocess
import sys

import numpy as np
import pytest
from gguf import GGML_QUANT_SIZES
from gguf import GGMLQuantizationType as G
from gguf.quants import dequantize as gguf_dequantize
from gguf.quants import quantize as gguf_quantize

from ds4d.engine import native

# Types the gguf package can quantize, and for the others the byte offsets of their f16
# scale fields inside a block (random bytes elsewhere are valid codes).
QUANTIZABLE = ["F32", "F16", "BF16", "Q4_0", "Q4_1", "Q5_0", "Q5_1", "Q8_0", "MXFP4"]
SCALE_OFFSETS = {
    "Q2_K": (80, 82),
    "Q3_K": (108,),
    "Q4_K": (0, 2),
    "Q5_K": (0, 2),
    "Q6_K": (208,),
    "IQ2_XXS": (0,),
    "IQ4_NL": (0,),
    "IQ4_XS": (0,),
}
ALL_TYPES = QUANTIZABLE + list(SCALE_OFFSETS)
N = 1280  # 5 super-blocks, 40 legacy blocks


def simd_levels() -> list[int]:
    """Every level this CPU runs (set_simd falls back to scalar for the others)."""
    levels = []
    for level in (native.SIMD_SCALAR, native.SIMD_AVX2, native.SIMD_NEON, native.SIMD_AVX512,
                  native.SIMD_AMX):  # fmt: skip
        if native.set_simd(level) == level:
            levels.append(level)
    native.set_simd(native.SIMD_AUTO)
    return levels


LEVELS = simd_levels()
# The vector levels among them (what the whole-forward tests compare with scalar).
SIMD_LEVELS = [lvl for lvl in LEVELS if lvl != native.SIMD_SCALAR]


@pytest.fixture(params=LEVELS, ids=[native.SIMD_NAMES[x] for x in LEVELS])
def level(request: pytest.FixtureRequest):
    native.set_simd(request.param)
    yield request.param
    native.set_simd(native.SIMD_AUTO)


def random_weights(qtype: str, rows: int, n: int, rng: np.random.Generator) -> np.ndarray:
    """rows x row_bytes uint8 of valid qtype blocks with realistic scales."""
    if qtype in QUANTIZABLE:
        w = rng.standard_normal((rows, n)).astype(np.float32) * 0.1
        return np.ascontiguousarray(gguf_quantize(w, G[qtype])).view(np.uint8).reshape(rows, -1)
    block_bytes = native.lib.ds4n_type_block_bytes(native.TYPES[qtype])
    raw = rng.integers(0, 256, size=(rows, native.row_bytes(qtype, n)), dtype=np.uint8)
    blocks = raw.reshape(-1, block_bytes)
    for off in SCALE_OFFSETS[qtype]:
        scale = rng.uniform(0.002, 0.05, size=len(blocks)) * rng.choice([-1, 1], size=len(blocks))
        blocks[:, off : off + 2] = scale.astype(np.float16).view(np.uint8).reshape(-1, 2)
    return raw


def reference(qtype: str, raw: np.ndarray) -> np.ndarray:
    if qtype == "F32":
        return raw.view(np.float32).copy()
    if qtype == "F16":
        return raw.view(np.float16).astype(np.float32)
    return gguf_dequantize(raw, G[qtype]).astype(np.float32)


@pytest.mark.parametrize("qtype", ALL_TYPES)
def test_dequantize_matches_gguf(qtype: str, level: int) -> None:
    rng = np.random.default_rng(1)
    n = N
    raw = random_weights(qtype, 3, n, rng)
    ref = reference(qtype, raw).reshape(3, n)
    for r in range(3):
        got = native.dequantize(qtype, raw[r], n)
        np.testing.assert_array_equal(got, ref[r])


def test_mxfp4_every_scale_exponent(level: int) -> None:
    """Every E8M0 scale byte, bit-exact against gguf: the subnormal half-scales of bytes 0 and 1,
    and 2^127 at 255, where the largest codes overflow to infinity."""
    rng = np.random.default_rng(4)
    blocks = rng.integers(0, 256, size=(256, 17), dtype=np.uint8)
    blocks[:, 0] = np.arange(256)
    with np.errstate(over="ignore"):
        ref = gguf_dequantize(blocks, G.MXFP4).reshape(-1)
    got = native.dequantize("MXFP4", blocks.reshape(-1), ref.size)
    np.testing.assert_array_equal(got, ref)
    nonzero = np.abs(got[got != 0])
    assert np.isinf(nonzero).any() and (nonzero < np.finfo(np.float32).tiny).any()


def test_iq4_xs_every_sub_block_scale(level: int) -> None:
    """All 64 six-bit IQ4_XS scales (8 per super-block, split over scales_l and scales_h)."""
    rng = np.random.default_rng(5)
    blocks = rng.integers(0, 256, size=(8, 136), dtype=np.uint8)
    blocks[:, 0:2] = np.full((8, 1), 0.01, np.float16).view(np.uint8)
    scales = np.arange(64).reshape(8, 8)  # super-block i, sub-block ib
    low, high = scales & 15, scales >> 4
    blocks[:, 4:8] = low[:, 0::2] | low[:, 1::2] << 4
    scales_h = (high << (2 * np.arange(8))).sum(axis=1).astype(np.uint16)
    blocks[:, 2:4] = scales_h.view(np.uint8).reshape(8, 2)
    ref = gguf_dequantize(blocks, G.IQ4_XS).reshape(-1)
    got = native.dequantize("IQ4_XS", blocks.reshape(-1), ref.size)
    np.testing.assert_array_equal(got, ref)
    assert (got.reshape(64, 32)[32] == 0).all()  # scale 32 - 32 = 0


@pytest.mark.parametrize("qtype", ALL_TYPES)
def test_dot_matches_float64(qtype: str, level: int) -> None:
    rng = np.random.default_rng(2)
    n = N
    raw = random_weights(qtype, 4, n, rng)
    ref = reference(qtype, raw).reshape(4, n).astype(np.float64)
    x = rng.standard_normal(n).astype(np.float32)
    for r in range(4):
        exact = float(ref[r] @ x)
        scale = float(np.abs(ref[r] * x).sum())
        got = native.dot(qtype, raw[r], x)
        assert abs(got - exact) <= 2e-6 * scale + 1e-30, (got, exact, scale)


@pytest.mark.parametrize("qtype", ALL_TYPES)
def test_simd_dequantize_is_bit_identical_to_scalar(qtype: str) -> None:
    rng = np.random.default_rng(3)
    n = N
    raw = random_weights(qtype, 1, n, rng)[0]
    native.set_simd(native.SIMD_SCALAR)
    scalar = native.dequantize(qtype, raw, n)
    try:
        for lvl in LEVELS:
            native.set_simd(lvl)
            np.testing.assert_array_equal(native.dequantize(qtype, raw, n), scalar)
    finally:
        native.set_simd(native.SIMD_AUTO)


def test_type_traits() -> None:
    for name, t in native.TYPES.items():
        assert native.lib.ds4n_type_supported(t), name
        block_size, type_size = GGML_QUANT_SIZES[G[name]]
        assert native.lib.ds4n_type_block_size(t) == block_size
        assert native.lib.ds4n_type_block_bytes(t) == type_size
    assert not native.lib.ds4n_type_supported(4)  # Q4_2, long gone
    assert not native.lib.ds4n_type_supported(99)
    with pytest.raises(native.EngineError, match="not supported"):
        native.type_id(99)


def test_best_simd_level_is_chosen_by_default() -> None:
    native.set_simd(native.SIMD_AUTO)
    assert native.simd_level() == max(LEVELS)


def test_unavailable_simd_level_falls_back_to_scalar() -> None:
    try:
        assert native.set_simd(7) == native.SIMD_SCALAR
        assert native.simd_level() == native.SIMD_SCALAR
        with pytest.raises(ValueError, match="unknown SIMD level"):
            native.set_simd("sse9")
    finally:
        native.set_simd(native.SIMD_AUTO)


def test_simd_level_from_environment() -> None:
    code = "from ds4d.engine import native; print(native.simd_level())"
    env = dict(os.environ, DS4N_SIMD="scalar")
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True)
    assert out.stdout.strip() == str(native.SIMD_SCALAR), out.stderr


def test_physical_cores() -> None:
    assert 1 <= native.physical_cores() <= len(os.sched_getaffinity(0))
