"""Micro-benchmark of the fused dequantize-dot kernels, one type against another (short: the
cores are shared).

    .venv/bin/python native/tests/bench_dot.py [--simd avx2] [--seconds 0.3] [--mib 1,64]

Runs single-threaded decode matvecs (ds4n_matmul with T = 1, one dot per row) over a weight
matrix of each size and prints, per type, the weight bytes and the values consumed per second.
The small matrix stays in cache (the kernel's own speed); the large one streams from memory
(what decode sees). CPU time of this thread is measured, so other processes disturb it little.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
from ds4d.engine import native  # noqa: E402
from tests.native.test_kernels import random_weights  # noqa: E402

TYPES = ["Q4_1", "Q8_0", "Q4_0", "Q4_K", "Q6_K", "IQ4_NL", "IQ4_XS", "MXFP4"]
K = 4096


def rate(fn, args: tuple, seconds: float) -> float:
    """Calls per second of fn(*args): the best of short batches over about `seconds`."""
    fn(*args)
    best, start = float("inf"), time.perf_counter()
    while time.perf_counter() - start < seconds:
        t0 = time.thread_time()
        for _ in range(3):
            fn(*args)
        best = min(best, (time.thread_time() - t0) / 3)
    return 1 / best


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--seconds", type=float, default=0.3)
    ap.add_argument("--simd", default="auto")
    ap.add_argument("--mib", default="1,64", help="weight matrix sizes, MiB")
    args = ap.parse_args()
    print("simd:", native.SIMD_NAMES[native.set_simd(args.simd)], "threads: 1", f"K: {K}")
    rng = np.random.default_rng(0)
    x = rng.standard_normal((1, K)).astype(np.float32)
    for mib in (float(m) for m in args.mib.split(",")):
        for qtype in TYPES:
            rows = max(1, int(mib * 2**20 // native.row_bytes(qtype, K)))
            W = random_weights(qtype, rows, K, rng)
            out = np.empty((1, rows), np.float32)
            r = rate(native.matmul, (None, qtype, W, rows, K, x, out), args.seconds)
            print(f"{mib:5.0f} MiB {qtype:7s} {W.nbytes / K / rows:5.3f} B/value "
                  f"{W.nbytes * r / 1e9:6.2f} GB/s {rows * K * r / 1e9:6.2f} Gvalues/s")  # fmt: skip


if __name__ == "__main__":
    main()
