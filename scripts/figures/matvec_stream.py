"""Decode matvec streaming speed per quant type: one thread, one token, a matrix larger than
the last-level cache on 2 MB huge pages (as the engine keeps a model's weights), so the
figure is what one core's kernel reaches against DRAM. Best of N; GB/s of weight bytes.

    .venv/bin/python scripts/figures/matvec_stream.py [--types Q4_K,Q6_K,Q8_0,Q4_0] [--mb 96]
        [--rounds 9] [--lib OTHER/libds4n.so ...] [--precision exact|int2|int3] [--threads N]

With --lib, each library (the first is this checkout's unless given) is measured in its own
subprocess (DS4D_NATIVE_LIB), interleaved round by round, for an A/B of two builds at the
SIMD level DS4N_SIMD selects. Timed in the calling thread's CPU time (the pool of one runs
the matvec in that thread): on a shared machine it is far steadier than wall time, though
other processes still compete for the memory bandwidth and the caches. With --threads N the
pool's N threads stream disjoint shares of the rows, timed in wall time: what the decode
matvecs reach together against `ds4d bench --bandwidth --threads N` (on a quiet machine).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from ds4d.engine import native  # noqa: E402

# Byte offsets of each type's f16 scales inside a block (random bytes elsewhere are valid).
SCALE_OFFSETS = {"Q4_K": (0, 2), "Q5_K": (0, 2), "Q6_K": (208,), "Q8_0": (0,), "Q4_0": (0,)}


def huge_zeros(n_bytes: int) -> np.ndarray:
    """n_bytes of anonymous memory advised for transparent huge pages, 2 MB aligned."""
    import mmap

    region = mmap.mmap(-1, n_bytes + (2 << 20), flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
    whole = np.frombuffer(region, dtype=np.uint8)
    start = -whole.ctypes.data % (2 << 20)
    if hasattr(mmap, "MADV_HUGEPAGE"):
        try:
            region.madvise(mmap.MADV_HUGEPAGE, start, n_bytes - n_bytes % mmap.PAGESIZE)
        except OSError:
            pass
    return whole[start : start + n_bytes]


def weights(qtype: str, rows: int, K: int, rng: np.random.Generator) -> np.ndarray:
    block_bytes = native.lib.ds4n_type_block_bytes(native.TYPES[qtype])
    rb = native.row_bytes(qtype, K)
    raw = huge_zeros(rows * rb).reshape(rows, rb)
    raw[:] = rng.integers(0, 256, size=(rows, rb), dtype=np.uint8)
    blocks = raw.reshape(-1, block_bytes)
    for off in SCALE_OFFSETS[qtype]:
        scale = rng.uniform(0.002, 0.05, size=len(blocks)).astype(np.float16)
        blocks[:, off : off + 2] = scale.view(np.uint8).reshape(-1, 2)
    return raw


def measure(types: list[str], mb: int, rounds: int, K: int, precision: str,
            threads: int = 1) -> dict[str, float]:  # fmt: skip
    """Best GB/s of each type over `rounds` matvecs: one thread in its CPU time, or a pool
    of `threads` (each streaming its share of the rows) in wall time."""
    rng = np.random.default_rng(0)
    out: dict[str, float] = {}
    clock = time.thread_time if threads == 1 else time.perf_counter
    with native.Pool(threads) as pool:
        pool.set_precision(precision)
        for qtype in types:
            rows = mb * 2**20 // native.row_bytes(qtype, K)
            raw = weights(qtype, rows, K, rng)
            x = rng.standard_normal((1, K)).astype(np.float32)
            y = np.empty((1, rows), np.float32)
            native.matmul(pool, qtype, raw, rows, K, x, y)  # warm: pages in, code loaded
            best = 1e9
            for _ in range(rounds):
                t = clock()
                native.matmul(pool, qtype, raw, rows, K, x, y)
                best = min(best, clock() - t)
            out[qtype] = raw.nbytes / best / 1e9
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--types", default="Q4_K,Q6_K,Q8_0,Q4_0")
    ap.add_argument("--mb", type=int, default=96, help="matrix size (larger than the L3)")
    ap.add_argument("--k", type=int, default=2048, help="row length (values)")
    ap.add_argument("--rounds", type=int, default=9)
    ap.add_argument("--lib", nargs="*", default=None, help="libraries to compare (A/B)")
    ap.add_argument("--precision", default="exact", choices=list(native.PRECISIONS))
    ap.add_argument("--threads", type=int, default=1, help="pool size (above 1: wall time)")
    ap.add_argument("--json", action="store_true", help=argparse.SUPPRESS)
    a = ap.parse_args()
    types = a.types.split(",")
    if a.lib is None:
        res = measure(types, a.mb, a.rounds, a.k, a.precision, a.threads)
        if a.json:
            print(json.dumps(res))
        else:
            for t, v in res.items():
                print(f"{t}: {v:.1f} GB/s")
        return
    # Interleaved: every library once per round, in its own process; best per library.
    best: dict[str, dict[str, float]] = {lib: {} for lib in a.lib}
    for _ in range(3):
        for lib in a.lib:
            env = dict(os.environ, DS4D_NATIVE_LIB=str(Path(lib).resolve()))
            cmd = [sys.executable, __file__, "--types", a.types, "--mb", str(a.mb)]
            cmd += ["--k", str(a.k), "--rounds", str(a.rounds), "--precision", a.precision]
            cmd += ["--threads", str(a.threads)]
            cmd += ["--json"]
            res = json.loads(subprocess.run(cmd, env=env, check=True, capture_output=True).stdout)
            for t, v in res.items():
                best[lib][t] = max(best[lib].get(t, 0.0), v)
    print("| type | " + " | ".join(a.lib) + " |")
    print("|---|" + "---|" * len(a.lib))
    for t in types:
        print(f"| {t} | " + " | ".join(f"{best[lib][t]:.1f} GB/s" for lib in a.lib) + " |")


if __name__ == "__main__":
    main()
