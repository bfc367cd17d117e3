"""Micro-benchmark of ds4n_matmul on SmolLM2-shaped matrices (short: the cores are shared).

    .venv/bin/python native/tests/bench_matmul.py [--threads 2] [--seconds 0.3] [--simd avx2]

Prints GFLOP/s of the prefill GEMM for several T, and of the decode matvec with its
effective weight bandwidth.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
from ds4d.engine import native  # noqa: E402

SHAPES = [("Q4_1", 576, 576), ("Q4_1", 192, 576), ("Q4_1", 1536, 576), ("Q4_1", 576, 1536),
          ("Q8_0", 49152, 576)]  # fmt: skip


def weights(qtype: str, rows: int, K: int, rng: np.random.Generator) -> np.ndarray:
    """Random bytes with sane f16 scales: speed does not depend on the values."""
    raw = rng.integers(0, 256, size=(rows, native.row_bytes(qtype, K)), dtype=np.uint8)
    bb = native.lib.ds4n_type_block_bytes(native.TYPES[qtype])
    blocks = raw.reshape(-1, bb)
    scale_fields = 2 if qtype in ("Q4_1", "Q5_1") else 1
    blocks[:, : 2 * scale_fields] = np.full((len(blocks), scale_fields), 0.01, np.float16).view(
        np.uint8
    )
    return raw


def rate(fn, args: tuple, seconds: float, clock=time.perf_counter) -> float:
    """Calls per second of fn(*args): the best of short batches over about `seconds`, so that
    other processes on the shared cores disturb the figure as little as possible."""
    fn(*args)
    best, start = float("inf"), time.perf_counter()
    while time.perf_counter() - start < seconds:
        t0 = clock()
        for _ in range(5):
            fn(*args)
        best = min(best, (clock() - t0) / 5)
    return 1 / best


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--seconds", type=float, default=0.3)
    ap.add_argument("--simd", default="auto")
    ap.add_argument("--tokens", default="16,64,256,512")
    args = ap.parse_args()
    print("simd:", native.SIMD_NAMES[native.set_simd(args.simd)], "threads:", args.threads)
    # One thread runs on this thread: count its CPU time, immune to other processes' load.
    clock = time.thread_time if args.threads == 1 else time.perf_counter
    rng = np.random.default_rng(0)
    with native.Pool(args.threads) as pool:
        for qtype, rows, K in SHAPES:
            W = weights(qtype, rows, K, rng)
            x = rng.standard_normal((1, K)).astype(np.float32)
            out = np.empty((1, rows), np.float32)
            r = rate(native.matmul, (pool, qtype, W, rows, K, x, out), args.seconds, clock)
            print(f"decode {qtype} {rows:5d}x{K:<5d} {2 * rows * K * r / 1e9:7.1f} GFLOP/s "
                  f"{W.nbytes * r / 1e9:6.1f} GB/s  {1e6 / r:8.1f} us")  # fmt: skip
        for T in (int(t) for t in args.tokens.split(",")):
            for qtype, rows, K in SHAPES[:4]:
                W = weights(qtype, rows, K, rng)
                X = rng.standard_normal((T, K)).astype(np.float32)
                out = np.empty((T, rows), np.float32)
                r = rate(native.matmul, (pool, qtype, W, rows, K, X, out), args.seconds, clock)
                print(f"gemm T={T:<4d} {qtype} {rows:5d}x{K:<5d} "
                      f"{2 * rows * K * T * r / 1e9:7.1f} GFLOP/s")  # fmt: skip


if __name__ == "__main__":
    main()
