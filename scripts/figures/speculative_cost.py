"""What a speculative verification costs: the time of one forward call over a chunk of
1..8 tokens with every position's logits (`Session.eval_all_logits`, what verification
runs) against one plain decode step, at a given context depth, on any GGUF.

With every drafted token accepted, a chunk of n tokens yields n tokens for the price of
one call, so n x t(1) / t(n) is the best speed-up; a chunk whose drafts all fail yields
one token for t(n) / t(1) times a step's cost. The figures hold whatever the model's
weights: a random-weight model of a published shape costs what the real one does.

With --draft-model, also what a draft model costs beside it, in the target's steps: one
draft pass (a single-token eval and its logits, what each drafted token takes), and the
draft session catching up with m tokens it skipped (one eval of m tokens: what a draft
after m plain steps pays first), each interleaved with a target step.

Usage: .venv/bin/python scripts/figures/speculative_cost.py [--model PATH] [--depth 512]
       [--reps 20] [--threads 2] [--draft-model PATH]
A measuring tool, not a test: it prints figures (with the load average), asserts nothing.
"""

from __future__ import annotations

import argparse
import os
import statistics
import time

import numpy as np

from ds4d.engine import Engine
from ds4d.engine.default_model import default_model_path
from ds4d.engine.engine import Session
from ds4d.serving.speculation import VERIFY_ROWS


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", default="")
    ap.add_argument("--depth", type=int, default=512)
    ap.add_argument("--reps", type=int, default=20)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--draft-model", default="")
    args = ap.parse_args()
    path = args.model or default_model_path()
    with Engine.open(path, threads=args.threads) as engine:
        session = engine.new_session(args.depth + VERIFY_ROWS + 8)
        words = ("the quick brown fox jumps over the lazy dog " * (args.depth // 4 + 1)).strip()
        prompt = engine.tokenizer.encode(words)[: args.depth]
        session.eval(prompt)
        chunk = prompt[:VERIFY_ROWS]
        base = None
        print(f"{os.path.basename(str(path))}, depth {args.depth}, {args.threads} threads, "
              f"median of {args.reps}, load {os.getloadavg()[0]:.2f}")  # fmt: skip
        for n in range(1, VERIFY_ROWS + 1):
            times, last = [], []
            for _ in range(args.reps):
                # interleaved: every row's logits (a verification), then the last row's only
                # (the same chunk without the head of its other rows)
                t0 = time.perf_counter()
                if n == 1:
                    session.eval(chunk[:1])
                else:
                    session.eval_all_logits(chunk[:n])
                times.append(time.perf_counter() - t0)
                session.rewind(args.depth)
                t0 = time.perf_counter()
                session.eval(chunk[:n])
                last.append(time.perf_counter() - t0)
                session.rewind(args.depth)
            t, t_last = statistics.median(times), statistics.median(last)
            base = base or t
            print(f"chunk {n}: {t * 1000:.2f} ms  ({t / base:.2f}x a step; all accepted: "
                  f"{n * base / t:.2f}x tokens/s); the last row's logits only: "
                  f"{t_last * 1000:.2f} ms ({t_last / base:.2f}x)", flush=True)  # fmt: skip
        if args.draft_model:
            draft_costs(engine, session, prompt, args)


def draft_costs(engine: Engine, session: Session, prompt: list[int],
                args: argparse.Namespace) -> None:  # fmt: skip
    """A draft pass and a draft session's catch-up of m tokens, in target steps (each
    measurement interleaved with a target step at the same depth)."""
    with Engine.open(args.draft_model, threads=args.threads) as draft:
        ds = draft.new_session(args.depth + 80)
        ds.eval(prompt[: args.depth - 64])
        print(f"draft {os.path.basename(args.draft_model)}, load {os.getloadavg()[0]:.2f}")
        for m in (1, 2, 4, 8, 16, 32, 64):
            steps, took = [], []
            for _ in range(args.reps):
                t0 = time.perf_counter()
                session.eval(prompt[:1])
                steps.append(time.perf_counter() - t0)
                session.rewind(args.depth)
                t0 = time.perf_counter()
                ds.eval(prompt[args.depth - 64 : args.depth - 64 + m])
                int(np.argmax(ds.last_logits))  # what a pass reads of its logits
                took.append(time.perf_counter() - t0)
                ds.rewind(args.depth - 64)
            step, t = statistics.median(steps), statistics.median(took)
            print(f"draft eval of {m} token(s): {t * 1000:.2f} ms = {t / step:.3f} target steps "
                  f"({t / step / m:.3f} a token; target step {step * 1000:.2f} ms)",
                  flush=True)  # fmt: skip
        ds.close()


if __name__ == "__main__":
    main()
