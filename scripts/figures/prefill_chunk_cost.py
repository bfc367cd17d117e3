"""What smaller prefill chunks cost: the CPU time of prefilling the same tokens in chunks
of each size, from a given depth, on the embedded model.

A session is filled to `--depth` tokens of the test text once; then, per repetition and
chunk size in turn (interleaved), it is rewound there and `--tokens` more are prefilled
in chunks of that size. The process's CPU time (all threads) is steadier than wall time
on a shared machine; the best of the repetitions is printed, with its ratio to the
largest chunk size.

Usage: .venv/bin/python scripts/figures/prefill_chunk_cost.py [--sizes 256,128,64,32]
       [--tokens 512] [--depth 0] [--reps 3] [--threads 2]
A measuring tool, not a test.
"""

from __future__ import annotations

import argparse
import os
import resource
import sys
from pathlib import Path

TEXT = Path(__file__).resolve().parents[2] / "tests/data/text/promessi_sposi.txt"


def cpu() -> float:
    r = resource.getrusage(resource.RUSAGE_SELF)
    return r.ru_utime + r.ru_stime


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--sizes", default="256,128,64,32")
    ap.add_argument("--tokens", type=int, default=512)
    ap.add_argument("--depth", type=int, default=0)
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--threads", type=int, default=2)
    args = ap.parse_args()
    from ds4d.engine.default_model import default_model_path
    from ds4d.engine.engine import Engine

    sizes = [int(s) for s in args.sizes.split(",")]
    engine = Engine.open(default_model_path(), threads=args.threads)
    tokens = engine.tokenizer.encode(TEXT.read_text())
    need = args.depth + args.tokens
    if len(tokens) < need:
        sys.exit(f"the text has {len(tokens)} tokens, {need} needed")
    session = engine.new_session(need + 1)
    if args.depth:
        session.eval(tokens[: args.depth])
    best: dict[int, float] = {}
    for _ in range(args.reps):
        for size in sizes:
            session.rewind(args.depth)
            start = cpu()
            for at in range(args.depth, need, size):
                session.eval(tokens[at : min(at + size, need)])
            best[size] = min(best.get(size, float("inf")), cpu() - start)
    base = best[max(sizes)]
    print(f"# {args.tokens} tokens from depth {args.depth}, {args.threads} threads, best of "
          f"{args.reps}; load {os.getloadavg()[0]:.2f}")  # fmt: skip
    print("chunk_tokens,cpu_s,vs_largest")
    for size in sizes:
        print(f"{size},{best[size]:.3f},{best[size] / base:.3f}")


if __name__ == "__main__":
    main()
