"""Engine-only cost of one batched decode step at 1..4 sessions (the embedded model), and of
a speculative verification chunk, against the single-session step: what the engine loop
pays when it advances several sessions at once, with the HTTP layer and the loop left out.

Each round, for every batch size b, `steps` decode steps of b sessions (300-token contexts,
one new token each, rewound after) are timed one by one and the median is printed; `verify
k` is one session evaluating a k-token chunk (a lookup draft's verification, k = drafted + 1).
With --lib A=path,B=path the rounds alternate between native libraries (each round a fresh
process with DS4D_NATIVE_LIB set), so a before/after comparison shares the machine's load;
the 1-minute load average is printed beside every round. With --threads 1 the figures are
the engine thread's CPU time (the ones to trust on a shared machine), else wall time.

Usage: .venv/bin/python scripts/figures/batched_step_cost.py [--threads 2] [--rounds 3]
       [--steps 40] [--lib before=/tmp/before/libds4n.so,after=native/build/libds4n.so]
A measuring tool, not a test: it prints figures, asserts nothing.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time

BATCHES = (1, 2, 3, 4)
VERIFY = (2, 4)  # chunk lengths of a verification (drafted tokens + 1)


def one_round(threads: int, steps: int) -> dict[str, float]:
    """Median ms of a step per configuration, in this process's native library."""
    from ds4d.engine.default_model import default_model_path
    from ds4d.engine.engine import Engine

    # One thread computes on this thread: count its CPU time, which other processes' load on
    # the shared cores barely moves; with more threads, wall time.
    clock = time.thread_time if threads == 1 else time.perf_counter
    medians: dict[str, float] = {}
    with Engine.open(default_model_path(), threads=threads) as eng:
        sessions = []
        for i in range(max(BATCHES)):
            s = eng.new_session(2048)
            s.eval(list(range(1000 + i, 1300 + i)))
            sessions.append(s)
        times: list[float] = []
        for it in range(steps):  # the single-session path (Session.eval of one token)
            t0 = clock()
            sessions[0].eval([1500 + it])
            times.append(clock() - t0)
        sessions[0].rewind(sessions[0].n_tokens - steps)
        medians["single"] = statistics.median(times) * 1e3
        for b in BATCHES:
            times = []
            for it in range(steps):
                t0 = clock()
                eng.eval_batch([(s, [1500 + it]) for s in sessions[:b]])
                times.append(clock() - t0)
            for s in sessions[:b]:
                s.rewind(s.n_tokens - steps)
            medians[f"batch {b}"] = statistics.median(times) * 1e3
        for k in VERIFY:
            times = []
            for it in range(steps):
                t0 = clock()
                sessions[0].eval([1500 + it + j for j in range(k)])
                times.append(clock() - t0)
                sessions[0].rewind(sessions[0].n_tokens - k)
            medians[f"verify {k}"] = statistics.median(times) * 1e3
    return medians


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--steps", type=int, default=40)
    ap.add_argument("--lib", default="", help="label=path,... native libraries to alternate")
    ap.add_argument("--one-round", action="store_true", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.one_round:
        print(json.dumps(one_round(args.threads, args.steps)))
        return
    libs = [tuple(x.split("=", 1)) for x in args.lib.split(",") if x] or [("this", "")]
    rows: dict[str, list[dict[str, float]]] = {label: [] for label, _ in libs}
    for rnd in range(args.rounds):
        # ABBA order: neither library always runs first
        for label, path in libs if rnd % 2 == 0 else libs[::-1]:
            env = dict(os.environ, DS4D_NATIVE_LIB=path) if path else dict(os.environ)
            load = os.getloadavg()[0]
            cmd = [sys.executable, __file__, "--one-round", "--threads", str(args.threads),
                   "--steps", str(args.steps)]  # fmt: skip
            out = subprocess.run(cmd, env=env, check=True, capture_output=True, text=True)
            m = json.loads(out.stdout.strip().splitlines()[-1])
            rows[label].append(m)
            base = m["single"]
            cells = "  ".join(f"{k} {v:6.2f} ({v / base:.2f}x)" for k, v in m.items())
            print(f"round {rnd} {label:>8} load {load:4.1f}: {cells}", flush=True)
    print("median over rounds, ms (x the single step):")
    for label, ms in rows.items():
        keys = ms[0].keys()
        med = {k: statistics.median(m[k] for m in ms) for k in keys}
        cells = "  ".join(f"{k} {v:6.2f} ({v / med['single']:.2f}x)" for k, v in med.items())
        print(f"  {label:>8}: {cells}")


if __name__ == "__main__":
    main()
