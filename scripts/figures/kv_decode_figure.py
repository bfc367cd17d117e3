"""Decode speed of the embedded model at long contexts for each KV type, as a fraction of
the machine's read-bandwidth bound.

A decode step reads every weight and the whole KV cache, so at long context the KV type
sets the speed. Prefilling 16k tokens on a small machine takes minutes per type, and
attention's cost does not depend on the values it reads, so each session here is filled
by loading random K/V rows of its type (the session payload's layout: float32 or half
values, or Q8_0 blocks) instead of a prefill; the decode steps that follow are real.
The bound is `ds4n_read_bandwidth` over the pool's threads; bytes per token are the
model's weights plus the KV rows of the held tokens.

    PYTHONPATH=. .venv/bin/python scripts/figures/kv_decode_figure.py [--threads 2] \
        [--ctx 512 4096 16384] [--steps 16] [--csv kv.csv] [--plot docs/kv-decode.png]

`ds4d bench --kv-type T --ctx-start N --ctx-max N --profile` measures the same thing after
a real prefill.
"""

from __future__ import annotations

import argparse
import csv
import io
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from ds4d.engine import Engine, native  # noqa: E402
from ds4d.engine.default_model import default_model_path  # noqa: E402

TYPES = ("f32", "f16", "q8_0")


def random_rows(kv_type: str, n_values: int, rng: np.random.Generator) -> bytes:
    """n_values K or V values of one layer in the payload layout of kv_type."""
    if kv_type == "f32":
        return rng.standard_normal(n_values).astype(np.float32).tobytes()
    if kv_type == "f16":
        return rng.standard_normal(n_values).astype(np.float16).tobytes()
    blocks = np.zeros((n_values // 32, 34), np.uint8)
    blocks[:, :2] = np.frombuffer(np.float16(0.02).tobytes(), np.uint8)
    blocks[:, 2:] = rng.integers(-127, 128, (len(blocks), 32)).astype(np.int8).view(np.uint8)
    return blocks.tobytes()


def measure(engine: Engine, kv_type: str, n_ctx: int, steps: int) -> float:
    """Best-of-3 decode tokens/s with n_ctx tokens held."""
    model, rng = engine.model, np.random.default_rng(0)
    state = model.new_state(n_ctx + 3 * steps + 2, kv_type)
    per_layer = model.n_head_kv * n_ctx * model.head_dim
    payload = b"".join(random_rows(kv_type, per_layer, rng) for _ in range(2 * model.n_layer))
    state.read_kv(io.BytesIO(payload), n_ctx)  # holds n_ctx positions afterwards
    logits = np.empty(model.n_vocab, np.float32)
    tokens = rng.integers(0, model.n_vocab, 3 * steps + 1).astype(np.int32)
    state.eval(tokens[:1], logits)  # warm-up
    best = 0.0
    for rep in range(3):
        t0 = time.perf_counter()
        for i in range(steps):
            state.eval(tokens[1 + rep * steps + i : 2 + rep * steps + i], logits)
        best = max(best, steps / (time.perf_counter() - t0))
    state.close()
    return best


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--ctx", type=int, nargs="+", default=[512, 4096, 16384])
    ap.add_argument("--steps", type=int, default=16, help="decode steps per run (3 runs)")
    ap.add_argument("--csv", type=Path)
    ap.add_argument("--plot", type=Path)
    args = ap.parse_args()
    rows = []
    with Engine.open(default_model_path(), threads=args.threads, kv_type="f32") as engine:
        weights = engine.info.file_bytes
        bandwidth = native.read_bandwidth(engine.pool, 512 << 20)
        print(f"read bandwidth {bandwidth / 1e9:.1f} GB/s ({engine.threads} threads)")
        for n in args.ctx:
            for t in TYPES:  # the types alternate at each context
                tps = measure(engine, t, n, args.steps)
                read = weights + n * engine.model.kv_token_bytes(t)
                frac = read * tps / bandwidth
                rows.append({"ctx": n, "kv_type": t, "decode_tps": round(tps, 2),
                             "mb_per_token": round(read / 1e6, 1),
                             "fraction_of_bound": round(frac, 3)})  # fmt: skip
                print(f"ctx {n:6d} kv {t:5s} {tps:7.1f} t/s  {read / 1e6:7.1f} MB/token  "
                      f"{100 * frac:5.1f}% of the bound")  # fmt: skip
    if args.csv:
        with args.csv.open("w", newline="") as f:
            w = csv.DictWriter(f, fieldnames=list(rows[0]))
            w.writeheader()
            w.writerows(rows)
    if args.plot:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt

        fig, ax = plt.subplots(figsize=(6, 3.6))
        for t in TYPES:
            pts = [(r["ctx"], r["decode_tps"]) for r in rows if r["kv_type"] == t]
            ax.plot([p[0] for p in pts], [p[1] for p in pts], marker="o", label=f"KV {t}")
        ax.set_xscale("log", base=2)
        ax.set_xlabel("context (tokens held)")
        ax.set_ylabel("decode tokens/s")
        ax.set_title(f"SmolLM2-135M Q4_1 decode by KV type, {args.threads} threads")
        ax.grid(alpha=0.3)
        ax.legend()
        fig.tight_layout()
        fig.savefig(args.plot, dpi=110)
    return 0


if __name__ == "__main__":
    sys.exit(main())
