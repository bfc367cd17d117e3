"""Where a prefill chunk's time goes, measured inside the native library (ds4n_profile_*).

Prefills `depth` tokens unprofiled, then one chunk of `chunk` tokens with the profile on, and
splits the chunk's wall time as `ds4d bench --profile` splits a decode token: the matmuls by
quant type and shape (each includes the quantization of its activations on the integer
path), the pool's other work (attention over the chunk and the SwiGLU), the pool's
synchronisation, the single-threaded steps between dispatches (norms, RoPE, KV writes) and
Python. Each matmul's multiply-accumulates per second are given per thread, to set against
one core's peaks (`int_path_speed.py peak`).

    .venv/bin/python scripts/figures/prefill_profile.py MODEL.gguf [--depth 3840] [--chunk 256]
        [--threads 2] [--precision exact|int2|int3] [--rounds 3]

The best (shortest) of `rounds` chunks is reported, each on a fresh session at the same depth.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from ds4d.engine import Engine, native  # noqa: E402

TEXT = Path(__file__).resolve().parents[2] / "tests/data/text/promessi_sposi.txt"


def prompt(engine: Engine, n: int) -> list[int]:
    ids = engine.tokenizer.encode(TEXT.read_text()[: n * 8], special=False)
    while len(ids) < n:
        ids = ids + ids
    return ids[:n]


def profile_chunk(engine: Engine, tokens: list[int], depth: int) -> tuple[float, list, dict]:
    with engine.new_session(len(tokens) + 1) as s:
        if depth:
            s.eval(tokens[:depth])
        native.Profile.enable()
        try:
            t0 = time.perf_counter()
            s.eval(tokens[depth:])
            total = time.perf_counter() - t0
            native.Profile.mark()
            entries, totals = native.Profile.read()
        finally:
            native.Profile.disable()
    return total, entries, totals


def report(total: float, entries: list, totals: dict, chunk: int, threads: int,
           n_vocab: int) -> None:  # fmt: skip
    names = native.TYPES_BY_ID
    rows: list[tuple[str, float, float]] = []  # name, wall s, MACs
    mm = 0.0
    for e in sorted(entries, key=lambda e: -e.wall_ns):
        what = "head" if e.rows == n_vocab else f"{e.rows}x{e.K}"
        kind = "matmul" if e.prefill else "matvec"  # the last token's logits: one row
        macs = e.calls * e.rows * e.K * (chunk if e.prefill else 1)
        rows.append((f"{kind} {names.get(e.type, e.type)} {what}", e.wall_ns / 1e9, macs))
        mm += e.wall_ns / 1e9
    sync = totals["sync_ns"] / 1e9
    other = totals["wall_ns"] / 1e9 - sync - mm
    serial = (totals["span_ns"] - totals["wall_ns"]) / 1e9
    rows += [("attention + SwiGLU (other pool work)", other, 0.0), ("pool sync", sync, 0.0),
             ("native serial (norms, RoPE, KV)", serial, 0.0),
             ("python", total - totals["span_ns"] / 1e9, 0.0)]  # fmt: skip
    print(f"{'part':<40} {'ms':>9} {'share':>7} {'G MAC/s/thread':>15}")
    for name, s, macs in rows:
        rate = f"{macs / s / threads / 1e9:15.1f}" if macs and s > 0 else f"{'':15}"
        print(f"{name:<40} {1e3 * s:9.1f} {100 * s / total:6.1f}% {rate}")
    all_macs = sum(m for _, _, m in rows)
    print(f"{'chunk':<40} {1e3 * total:9.1f} {100.0:6.1f}% "
          f"{all_macs / mm / threads / 1e9:15.1f}  (matmuls only; {chunk / total:.1f} t/s)")  # fmt: skip


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("model")
    p.add_argument("--depth", type=int, default=0, help="tokens prefilled before the chunk")
    p.add_argument("--chunk", type=int, default=256, help="tokens in the profiled chunk")
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--precision", default="exact")
    p.add_argument("--kv-type", default="f16")
    p.add_argument("--rounds", type=int, default=1)
    a = p.parse_args()
    engine = Engine.open(a.model, threads=a.threads, kv_type=a.kv_type, precision=a.precision)
    tokens = prompt(engine, a.depth + a.chunk)
    best = None
    for _ in range(a.rounds):
        run = profile_chunk(engine, tokens, a.depth)
        if best is None or run[0] < best[0]:
            best = run
    assert best is not None
    print(f"# {Path(a.model).name}: {a.chunk}-token chunk at depth {a.depth}, {a.threads} "
          f"threads, precision {a.precision}, kv {a.kv_type}, best of {a.rounds}")  # fmt: skip
    report(*best, a.chunk, a.threads, engine.info.n_vocab)
    engine.close()


if __name__ == "__main__":
    main()
