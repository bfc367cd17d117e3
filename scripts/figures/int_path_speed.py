"""Speed of each matmul precision (exact, int2, int3), in CPU time of one thread (the machine
is shared: CPU time is far steadier than wall time there), best of N, interleaved.

    .venv/bin/python scripts/figures/int_path_speed.py kernels [Q4_K,Q6_K,...] [ROWSxK]  # matmuls,
                                                                          # 2048x2048 by default
    .venv/bin/python scripts/figures/int_path_speed.py model [MODEL.gguf [exact,int2]]  # 512-token
                                                                   # prefill, 32 decode steps
    .venv/bin/python scripts/figures/int_path_speed.py peak    # one core's measured MAC/s peaks
                                                               # (scripts/figures/mac_peak.c)
"""

from __future__ import annotations

import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from ds4d.engine import Engine, native  # noqa: E402
from ds4d.engine.default_model import default_model_path  # noqa: E402

PRECISIONS = ("exact", "int2", "int3")


def kernels(types: list[str], rows: int = 2048, K: int = 2048, rounds: int = 7) -> None:
    from tests.native.test_kernels import random_weights

    rng = np.random.default_rng(0)
    for qtype in types:
        raw = random_weights(qtype, rows, K, rng)
        with native.Pool(1) as pool:
            for T in (1, 64):
                X = rng.standard_normal((T, K)).astype(np.float32)
                best = dict.fromkeys(PRECISIONS, 1e9)
                for _ in range(rounds):
                    for p in PRECISIONS:
                        pool.set_precision(p)
                        t = time.thread_time()
                        native.matmul(pool, qtype, raw, rows, K, X)
                        best[p] = min(best[p], time.thread_time() - t)
                cells = " | ".join(
                    f"{p} {best[p] * 1e3:.2f} ms ({rows * K * T / best[p] / 1e9:.0f} G MAC/s)"
                    for p in PRECISIONS
                )
                print(f"{qtype} T={T}: {cells}", flush=True)


def model(path: str, precisions: tuple[str, ...] = PRECISIONS, rounds: int = 3) -> None:
    engines = {p: Engine.open(path, threads=1, kv_type="f16", precision=p) for p in precisions}
    best = {p: [0.0, 0.0] for p in precisions}
    for _ in range(rounds):
        for p, e in engines.items():
            with e.new_session(1024) as s:
                t = time.thread_time()
                s.eval(list(range(100, 612)))
                prefill = 512 / (time.thread_time() - t)
                t = time.thread_time()
                for i in range(32):
                    s.eval([200 + i])
                decode = 32 / (time.thread_time() - t)
            best[p] = [max(best[p][0], prefill), max(best[p][1], decode)]
    for p, (a, b) in best.items():
        print(f"{p}: prefill {a:.0f} t/s, decode {b:.1f} t/s (1 thread, CPU time)")
    for e in engines.values():
        e.close()


def peak() -> None:
    source = Path(__file__).with_name("mac_peak.c")
    with tempfile.TemporaryDirectory() as tmp:
        exe = Path(tmp) / "mac_peak"
        flags = ["-O2", "-mavx512f", "-mavx512bw", "-mavx512vnni"]
        subprocess.run(["cc", *flags, "-o", str(exe), str(source)], check=True)
        subprocess.run([str(exe)], check=True)


if __name__ == "__main__":
    what = sys.argv[1] if len(sys.argv) > 1 else "kernels"
    if what == "peak":
        peak()
    elif what == "kernels":
        shape = sys.argv[3].split("x") if len(sys.argv) > 3 else ["2048", "2048"]
        types = sys.argv[2].split(",") if len(sys.argv) > 2 else ["Q4_K", "Q6_K", "Q8_0"]
        kernels(types, int(shape[0]), int(shape[1]))
    else:
        path = sys.argv[2] if len(sys.argv) > 2 else str(default_model_path())
        model(path, tuple(sys.argv[3].split(",")) if len(sys.argv) > 3 else PRECISIONS)
