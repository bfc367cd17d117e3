"""ds4n_matmul (decode matvec and blocked prefill GEMM) against float64 numpy, over the
types models use, token counts on and off the tile sizes, odd row counts, 1 and 2 threads."""

from __future__ import annotations

import ctypes

import numpy as np
import pytest

from ds4d.engine import native
from tests.native.test_kernels import ALL_TYPES, LEVELS, random_weights, reference

MODEL_TYPES = ["Q4_1", "Q8_0", "Q4_K", "Q6_K", "F16", "F32", "IQ2_XXS", "Q5_K", "BF16", "IQ4_NL",
               "IQ4_XS", "MXFP4", "Q4_0", "Q5_0", "Q5_1"]  # fmt: skip


@pytest.fixture(scope="module", params=[1, 2], ids=["1thread", "2threads"])
def pool(request: pytest.FixtureRequest):
    with native.Pool(request.param) as p:
        yield p


def check(qtype: str, rows: int, K: int, T: int, pool: native.Pool | None, seed: int = 0) -> None:
    rng = np.random.default_rng(seed)
    raw = random_weights(qtype, rows, K, rng)
    W = reference(qtype, raw).reshape(rows, K).astype(np.float64)
    X = rng.standard_normal((T, K)).astype(np.float32)
    assert_matches(native.matmul(pool, qtype, raw, rows, K, X), X, W)


def assert_matches(got: np.ndarray, X: np.ndarray, W: np.ndarray) -> None:
    """got = X·Wᵀ within float32 rounding of the sums (W: float64 dequantized weights)."""
    exact = X.astype(np.float64) @ W.T
    bound = 3e-6 * (np.abs(X).astype(np.float64) @ np.abs(W).T) + 1e-30
    err = np.abs(got - exact)
    assert (err <= bound).all(), f"max err {err.max()} (bound there {bound.flat[err.argmax()]})"


@pytest.mark.parametrize("T", [1, 2, 5, 64, 130])
@pytest.mark.parametrize("qtype", MODEL_TYPES)
def test_matmul_matches_float64(qtype: str, T: int, pool: native.Pool) -> None:
    check(qtype, rows=37, K=512, T=T, pool=pool)


@pytest.mark.parametrize("level", LEVELS, ids=[native.SIMD_NAMES[x] for x in LEVELS])
@pytest.mark.parametrize("T", [1, 7])
def test_matmul_every_simd_level(level: int, T: int, pool: native.Pool) -> None:
    native.set_simd(level)
    try:
        for qtype in ("Q4_1", "Q8_0", "Q4_K", "Q5_K", "Q6_K", "Q5_0", "IQ4_NL", "IQ4_XS", "MXFP4"):
            check(qtype, rows=21, K=768, T=T, pool=pool, seed=T)
    finally:
        native.set_simd(native.SIMD_AUTO)


@pytest.mark.parametrize("level", LEVELS, ids=[native.SIMD_NAMES[x] for x in LEVELS])
@pytest.mark.parametrize("K", [96, 224])
def test_matvec_rows_of_block_counts_off_four(level: int, K: int, pool: native.Pool) -> None:
    """Decode matvecs take the blocks' scales four blocks at a time where they can: rows of
    3 and 7 blocks (no whole four, and a tail of three) still match, in 1..4-row passes."""
    native.set_simd(level)
    try:
        for qtype in ("Q4_0", "Q4_1", "Q5_0", "Q5_1", "Q8_0", "IQ4_NL"):
            for rows in (1, 3, 13):
                check(qtype, rows=rows, K=K, T=1, pool=pool, seed=K + rows)
    finally:
        native.set_simd(native.SIMD_AUTO)


def per_token(pool: native.Pool | None, qtype: str, raw: np.ndarray, rows: int, K: int,
              X: np.ndarray) -> np.ndarray:  # fmt: skip
    return np.concatenate(
        [native.matmul(pool, qtype, raw, rows, K, X[t : t + 1]) for t in range(len(X))]
    )


@pytest.mark.parametrize("level", LEVELS, ids=[native.SIMD_NAMES[x] for x in LEVELS])
@pytest.mark.parametrize("qtype", ALL_TYPES)
def test_small_batch_is_bitwise_the_single_token_path(
    qtype: str, level: int, pool: native.Pool
) -> None:
    """2..8 tokens in one call (several sessions' decode steps batched) give each token
    exactly the bits it gets alone, so batching never changes a greedy answer: every tile
    shape (1..4 rows a pass, and the tail rows of a worker's share past whole tiles)."""
    native.set_simd(level)
    try:
        rng = np.random.default_rng(11)
        K = 768
        for rows in (1, 3, 6, 37):
            raw = random_weights(qtype, rows, K, rng)
            X = rng.standard_normal((8, K)).astype(np.float32)
            alone = per_token(pool, qtype, raw, rows, K, X)
            for T in range(2, 9):
                got = native.matmul(pool, qtype, raw, rows, K, X[:T])
                np.testing.assert_array_equal(
                    got.view(np.uint32), alone[:T].view(np.uint32), f"rows={rows} T={T}"
                )
    finally:
        native.set_simd(native.SIMD_AUTO)


@pytest.mark.parametrize(
    ("qtype", "K"),
    # K = 40: a row off the block size, which only the float types allow
    [(q, k) for q in ("Q4_1", "Q8_0", "Q6_K", "F16", "F32") for k in (16384, 16384 + 256)]
    + [("F16", 40), ("F32", 40)],
)
def test_small_batch_bitwise_on_odd_and_long_rows(qtype: str, K: int, pool: native.Pool) -> None:
    """Rows off the block size (float types), a batch whose per-32 sums fill the stack
    buffer (512 x 8), and rows past it (8 tokens go one by one): still each token's bits."""
    rng = np.random.default_rng(K)
    rows = 9
    raw = random_weights(qtype, rows, K, rng)
    X = rng.standard_normal((8, K)).astype(np.float32)
    alone = per_token(pool, qtype, raw, rows, K, X)
    for T in (2, 5, 8):
        got = native.matmul(pool, qtype, raw, rows, K, X[:T])
        np.testing.assert_array_equal(got.view(np.uint32), alone[:T].view(np.uint32), f"T={T}")


@pytest.mark.parametrize("K", [1, 7, 13, 300, 1000])
def test_matmul_float_rows_of_any_length(K: int, pool: native.Pool) -> None:
    for T in (1, 4):
        check("F32", rows=5, K=K, T=T, pool=pool)
        check("F16", rows=3, K=K, T=T, pool=pool)


def test_matmul_one_expert_of_a_3d_mxfp4_tensor(pool: native.Pool) -> None:
    """MoE experts are stored as [n_expert][rows][K]: expert e is the matrix at byte offset
    e * rows * row_bytes, which for MXFP4's 17-byte blocks is an odd address."""
    rng = np.random.default_rng(7)
    n_expert, rows, K = 3, 5, 96
    raw = random_weights("MXFP4", n_expert * rows, K, rng).reshape(n_expert, rows, -1)
    X = rng.standard_normal((4, K)).astype(np.float32)
    for e in range(n_expert):
        expert = raw[e]
        assert expert.ctypes.data % 2 == e % 2
        W = reference("MXFP4", expert).reshape(rows, K).astype(np.float64)
        for T in (1, 4):
            assert_matches(native.matmul(pool, "MXFP4", expert, rows, K, X[:T]), X[:T], W)


def test_matmul_long_rows_span_several_panels(pool: native.Pool) -> None:
    check("Q4_1", rows=9, K=1536 + 32, T=11, pool=pool)


def test_matmul_without_pool_and_fewer_rows_than_threads() -> None:
    check("Q8_0", rows=1, K=64, T=3, pool=None)
    with native.Pool(2) as p:
        check("Q8_0", rows=1, K=64, T=3, pool=p)
        check("Q8_0", rows=2, K=64, T=1, pool=p)


def test_matmul_writes_into_out_and_checks_shapes() -> None:
    rng = np.random.default_rng(5)
    raw = random_weights("Q4_1", 8, 64, rng)
    X = rng.standard_normal((3, 64)).astype(np.float32)
    out = np.full((3, 8), np.nan, dtype=np.float32)
    assert native.matmul(None, "Q4_1", raw, 8, 64, X, out=out) is out
    assert np.isfinite(out).all()
    with pytest.raises(ValueError):
        native.matmul(None, "Q4_1", raw, 8, 64, X, out=np.empty((8, 3), np.float32))
    with pytest.raises(ValueError):
        native.matmul(None, "Q4_1", raw, 9, 64, X)  # W too small
    with pytest.raises(ValueError):
        native.matmul(None, "Q4_1", raw, 8, 64, X.astype(np.float64))


@pytest.mark.parametrize("threads", [2, 5])
def test_pool_runs_every_share_once(threads: int) -> None:
    """Shares are claimed by whichever pool thread is free; each runs exactly once per job,
    also with more threads than cores."""
    calls: list[tuple[int, int]] = []

    @native.POOL_FN
    def task(ctx: int | None, ith: int, nth: int) -> None:
        calls.append((ith, nth))

    with native.Pool(threads) as p:
        assert p.threads == threads
        for job in range(50):
            native.lib.ds4n_pool_run(p.handle, task, None)
            assert sorted(calls) == [(i, threads) for i in range(threads)], job
            calls.clear()


def test_matmul_on_an_oversubscribed_pool() -> None:
    with native.Pool(5) as p:
        for T in (1, 9):
            check("Q4_1", rows=45, K=256, T=T, pool=p)


def test_matmul_part_covers_all_rows_once() -> None:
    rng = np.random.default_rng(6)
    rows, K, T = 23, 96, 4
    raw = random_weights("Q4_1", rows, K, rng)
    X = rng.standard_normal((T, K)).astype(np.float32)
    whole = native.matmul(None, "Q4_1", raw, rows, K, X)
    parts = np.full((T, rows), np.nan, dtype=np.float32)
    fptr = ctypes.POINTER(ctypes.c_float)
    for nth in (3,):
        for ith in range(nth):
            native.lib.ds4n_matmul_part(
                native.Q4_1, raw.ctypes.data, rows, K, X.ctypes.data_as(fptr), T,
                parts.ctypes.data_as(fptr), ith, nth,
            )  # fmt: skip
    np.testing.assert_array_equal(parts, whole)
