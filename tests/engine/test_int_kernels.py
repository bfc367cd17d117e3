"""The integer-activation path (precision int2/int3, native/quants_int.h): bitwise the scalar
reference at every SIMD level, every token bitwise its single-token result whatever the batch
(decode, batched decode, prefill tiles), within a stated bound of the exact float64 product,
and defined results for hostile activations (NaN, infinities, huge and tiny values, zeros). Near the float range's end
(|x| ~ 1e38) the biased integer sums overflow to infinity sooner than float32 products would:
such a block gives NaN or infinity, never undefined behaviour."""

from __future__ import annotations

import numpy as np
import pytest

from ds4d.engine import native
from tests.native.test_kernels import LEVELS, random_weights, reference

INT_TYPES = ["Q4_0", "Q4_1", "Q8_0", "Q4_K", "Q6_K"]
PRECISIONS = ["int2", "int3"]


@pytest.fixture(params=[1, 2], ids=["1thread", "2threads"])
def pool(request: pytest.FixtureRequest):
    with native.Pool(request.param) as p:
        yield p


def run(pool: native.Pool, precision: str, qtype: str, raw: np.ndarray, rows: int, K: int,
        X: np.ndarray, level: int = native.SIMD_AUTO) -> np.ndarray:  # fmt: skip
    pool.set_precision(precision)
    native.set_simd(level)
    try:
        return native.matmul(pool, qtype, raw, rows, K, X)
    finally:
        native.set_simd(native.SIMD_AUTO)
        pool.set_precision("exact")


def activations(rng: np.random.Generator, T: int, K: int) -> np.ndarray:
    """Normal values with a few outliers per row, as residual streams have."""
    X = rng.standard_normal((T, K)).astype(np.float32)
    X[:, rng.integers(0, K, 3)] *= 40.0
    return X


def test_types_with_integer_kernels() -> None:
    assert [
        t
        for t in ("Q4_0", "Q4_1", "Q8_0", "Q4_K", "Q6_K", "Q5_K", "F32")
        if native.int_type_supported(t)
    ] == INT_TYPES


@pytest.mark.parametrize("precision", PRECISIONS)
@pytest.mark.parametrize("qtype", INT_TYPES)
def test_every_simd_level_is_bitwise_the_scalar_reference(
    qtype: str, precision: str, pool: native.Pool
) -> None:
    rng = np.random.default_rng(1)
    rows = 19
    # rows of 32-block types may end in a part group: 2 blocks (SmolLM2's 576) or 3
    # the K-quants' prefill walks K in slices of super-blocks (4 on the part kernels, 8 on
    # the tile kernels): 1280 and 2304 end in a part slice
    # rows over 1 KB (1888 of a 32-block type, 2304 of a K-quant) take decode's rows kernel
    for K in (512, 576, 608, 1888) if qtype in ("Q8_0", "Q4_0", "Q4_1") else (512, 1280, 2304):
        raw = random_weights(qtype, rows, K, rng)
        # decode, batched decode, prefill tiles with a remainder (rows 19: a lone last row;
        # tokens 10, 21, 70: tiles of 4 tokens ending in 2, 1 and 2), more than a chunk (64
        # tokens; 256 on the K-quants' tile path)
        long = (260,) if qtype in ("Q4_K", "Q6_K") else ()
        for T in (1, 4, 8, 10, 21, 70, *long):
            X = activations(rng, T, K)
            want = run(pool, precision, qtype, raw, rows, K, X, native.SIMD_SCALAR)
            for level in LEVELS:
                got = run(pool, precision, qtype, raw, rows, K, X, level)
                assert got.tobytes() == want.tobytes(), (native.SIMD_NAMES[level], K, T)


@pytest.mark.parametrize("precision", PRECISIONS)
@pytest.mark.parametrize("qtype", INT_TYPES)
def test_each_token_is_bitwise_its_single_token_result(
    qtype: str, precision: str, pool: native.Pool
) -> None:
    rng = np.random.default_rng(2)
    rows, K = 37, 1280
    raw = random_weights(qtype, rows, K, rng)
    X = activations(rng, 77, K)
    alone = np.stack(
        [run(pool, precision, qtype, raw, rows, K, X[t : t + 1])[0] for t in range(77)]
    )
    for T in (4, 8, 77):
        got = run(pool, precision, qtype, raw, rows, K, X[:T])
        assert got.tobytes() == alone[:T].tobytes(), T


# Each activation is kept to BOUND[p] of the largest |x| of its scale group (32 values, the
# block format; 256, the K-quants' super-block format): 2^-14 with int2, 2^-21 with int3. So
# |error| <= BOUND[p]·Σ_groups amax_g·Σ_{j in g}|w_j|, plus float32 accumulation.
BOUND = {"int2": 2.0**-14, "int3": 2.0**-21}
GROUP = {"Q4_K": 256, "Q6_K": 256}


def group_bound(X: np.ndarray, W: np.ndarray, group: int) -> np.ndarray:
    """Σ_g amax_g(x)·Σ_{j in g}|w_j| for every token and row."""
    T, K = X.shape
    amax = np.abs(X).reshape(T, K // group, group).max(axis=2).astype(np.float64)
    wsum = np.abs(W).reshape(W.shape[0], K // group, group).sum(axis=2)
    return amax @ wsum.T


@pytest.mark.parametrize("precision", PRECISIONS)
@pytest.mark.parametrize("qtype", INT_TYPES)
def test_close_to_the_exact_product(qtype: str, precision: str, pool: native.Pool) -> None:
    rng = np.random.default_rng(3)
    rows, K, T = 29, 1024, 12
    raw = random_weights(qtype, rows, K, rng)
    W = reference(qtype, raw).reshape(rows, K).astype(np.float64)
    X = activations(rng, T, K)
    got = run(pool, precision, qtype, raw, rows, K, X)
    exact = X.astype(np.float64) @ W.T
    scale = np.abs(X).astype(np.float64) @ np.abs(W).T
    bound = BOUND[precision] * group_bound(X, W, GROUP.get(qtype, 32)) + 2.0**-20 * scale
    err = np.abs(got - exact)
    assert (err <= bound).all(), float((err / bound).max())
    # and the bound is not loose by orders of magnitude: int2 really is coarser than int3
    if precision == "int2":
        assert (err / scale).max() > 2.0**-20


@pytest.mark.parametrize("precision", PRECISIONS)
@pytest.mark.parametrize("qtype", INT_TYPES)
def test_hostile_activations(qtype: str, precision: str, pool: native.Pool) -> None:
    rng = np.random.default_rng(4)
    rows, K = 8, 512
    raw = random_weights(qtype, rows, K, rng)
    W = reference(qtype, raw).reshape(rows, K).astype(np.float64)
    X = activations(rng, 6, K)
    X[0, 5] = np.nan
    X[1, 300] = np.inf
    X[2, :] = 0.0
    X[3, :32] = 1e30  # huge: the block's scale carries it
    X[4, :] = 1e-35  # below the smallest block scale: counts as zero
    X[5, 64:96] = -0.0
    got = run(pool, precision, qtype, raw, rows, K, X)
    want = run(pool, precision, qtype, raw, rows, K, X, native.SIMD_SCALAR)
    assert got.tobytes() == want.tobytes()
    assert np.isnan(got[0]).all() and np.isnan(got[1]).all()
    assert (got[2] == 0).all()
    exact3 = X[3].astype(np.float64) @ W.T
    assert np.allclose(got[3], exact3, rtol=1e-3, atol=1e-3 * np.abs(exact3).max())
    assert (np.abs(got[4]) < 1e-30).all()
    exact = X[5].astype(np.float64) @ W.T
    assert np.allclose(got[5], exact, rtol=1e-3, atol=1e-3 * np.abs(exact).max())


def test_exact_precision_is_the_float_path(pool: native.Pool) -> None:
    rng = np.random.default_rng(5)
    raw = random_weights("Q4_K", 16, 512, rng)
    X = activations(rng, 3, 512)
    float_path = native.matmul(pool, "Q4_K", raw, 16, 512, X)
    assert run(pool, "exact", "Q4_K", raw, 16, 512, X).tobytes() == float_path.tobytes()
    assert run(pool, "int3", "Q4_K", raw, 16, 512, X).tobytes() != float_path.tobytes()
    with pytest.raises(ValueError, match="unknown precision"):
        pool.set_precision("int4")


@pytest.mark.parametrize("precision", PRECISIONS)
@pytest.mark.parametrize("qtype", ["Q4_K", "Q6_K"])
def test_super_block_sums_at_their_bound_do_not_overflow(qtype: str, precision: str) -> None:
    """The largest code·scale of the type against activations at the top of their range
    (|a| = 2^15 - 1) in every value: the int32 lane sums reach the bound quants_int.h states
    (Q6_K 2^31 - 2^16) and must still give the exact product."""
    K = 1024
    if qtype == "Q6_K":  # ql = qh = 0: code -32; scales -128; d = 1
        block = np.zeros(210, np.uint8)
        block[192:208] = 0x80
        block[208:210] = np.array([1.0], np.float16).view(np.uint8)
    else:  # nibbles 15, scales and mins 63; d = 1, dmin = 1
        block = np.full(144, 0xFF, np.uint8)
        block[0:4] = np.array([1.0, 1.0], np.float16).view(np.uint8)
    raw = np.tile(block, (2, K // 256))
    W = reference(qtype, raw).reshape(2, K).astype(np.float64)
    X = np.full((3, K), 1.99999, np.float32)  # rounds to 2^15, clamped to 2^15 - 1 units of 2^-14
    X[1] *= -1.0
    X[2, ::2] *= -1.0
    rtol = BOUND[precision] + 2.0**-20  # the clamp's unit, within the stated bound; an overflow
    with native.Pool(1) as pool:  # would be off by far more (a sign flip)
        for level in LEVELS:
            got = run(pool, precision, qtype, raw, 2, K, X, level)
            exact = X.astype(np.float64) @ W.T
            assert np.allclose(got, exact, rtol=rtol, atol=rtol * np.abs(W).sum()), (level, got)


# Limb-0 values (units of the group's scale 2^-14) at the byte split's edges (AVX2 decodes
# the K-quants on a = 256·h + l, l the low byte unsigned, h the high byte signed): the clamp
# (32767.99 rounds to 2^15 and clamps to 2^15 - 1), low bytes 0x80 and 0xff near both ends
# (where two signed bytes, or a high byte rounded instead of floored, leave int8), ±255,
# ±256, ±1, 0, and fractions for int3's second limb.
EDGES = [32767.99, -32767.99, 32767.0, -32767.0, 32640.0, 32639.6, 32767.4, -32640.0,
         -32641.0, -32513.0, -32512.6, 255.0, 256.0, -256.0, -255.0, -1.0, 1.0, 0.0, 128.0,
         -128.0, -129.0, 127.5, 16383.7, -16384.3, 383.0]  # fmt: skip


@pytest.mark.parametrize("precision", PRECISIONS)
@pytest.mark.parametrize("qtype", ["Q4_K", "Q6_K"])
def test_super_block_activations_at_the_byte_split_edges(
    qtype: str, precision: str, pool: native.Pool
) -> None:
    rng = np.random.default_rng(6)
    rows, K = 7, 1280
    raw = random_weights(qtype, rows, K, rng)
    V = rng.choice(np.array(EDGES, np.float32), size=(9, K))
    V[:, ::256] = 32767.99 * rng.choice([-1.0, 1.0], size=(9, K // 256))  # each group's scale 2^-14
    X = (V * 2.0**-14).astype(np.float32)
    for T in (1, 2, 5, 9):
        want = run(pool, precision, qtype, raw, rows, K, X[:T], native.SIMD_SCALAR)
        for level in LEVELS:
            got = run(pool, precision, qtype, raw, rows, K, X[:T], level)
            assert got.tobytes() == want.tobytes(), (native.SIMD_NAMES[level], T)
