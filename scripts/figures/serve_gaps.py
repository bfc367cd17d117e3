"""The inter-token gaps of serving-bench rounds, whole: every tree's gaps pooled over its
rounds (the `--requests-log` JSON lines that scripts/figures/serve_rounds.sh writes with
CLIENT=; gzipped or not), for each client count K, as quantiles and as a histogram on a log scale, so a
difference in one percentile can be read against the whole distribution (a scheduler that
lets one stream run in bursts has many short gaps and a few long ones; one that batches
every stream in every step has gaps of one batched step).

    .venv/bin/python scripts/figures/serve_gaps.py LOG.requests.jsonl [...] --trees before,main

A measuring aid, not a test: it prints figures, asserts nothing.
"""

from __future__ import annotations

import argparse
import gzip
import json
import math
from collections import defaultdict

from ds4d.tools.bench_serve import percentile

QUANTILES = (50, 75, 90, 95, 97, 99)
EDGES_MS = (5, 10, 15, 20, 25, 30, 40, 60, 100, 200, 400, 1000, math.inf)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("log", nargs="+")
    ap.add_argument("--trees", required=True, help="tree names, comma-separated, as labelled")
    args = ap.parse_args()
    trees = args.trees.split(",")
    gaps: dict[int, dict[str, list[float]]] = defaultdict(lambda: defaultdict(list))
    rounds: dict[tuple[int, str], set[str]] = defaultdict(set)
    for path in args.log:
        with gzip.open(path, "rt") if path.endswith(".gz") else open(path) as f:
            for line in f:
                r = json.loads(line)
                tree, _, rnd = r["label"].rpartition("-")
                if tree in trees and not r["error"]:
                    gaps[r["clients"]][tree] += [g * 1e3 for g in r["gaps_s"]]
                    rounds[(r["clients"], tree)].add(f"{path}:{rnd}")
    for k in sorted(gaps):
        print(f"K = {k}: inter-token gaps pooled over the rounds, ms")
        head = " ".join(f"{'p' + str(q):>6}" for q in QUANTILES)
        print(f"  {'tree':>8} {'rounds':>6} {'gaps':>6} {head} {'max':>7} {'mean':>6}")
        for tree in trees:
            s = sorted(gaps[k][tree])
            if not s:
                continue
            qs = " ".join(f"{percentile(s, q) or 0.0:6.1f}" for q in QUANTILES)
            print(f"  {tree:>8} {len(rounds[(k, tree)]):>6} {len(s):>6} {qs} {s[-1]:7.1f} "
                  f"{sum(s) / len(s):6.1f}")  # fmt: skip
        print(
            f"  share of gaps up to each edge (ms): {' '.join(str(e) for e in EDGES_MS[:-1])} inf"
        )
        for tree in trees:
            s = gaps[k][tree]
            if not s:
                continue
            counts = [0] * len(EDGES_MS)
            for g in s:
                counts[next(i for i, e in enumerate(EDGES_MS) if g <= e)] += 1
            print(f"  {tree:>8} " + " ".join(f"{100 * c / len(s):5.1f}%" for c in counts))


if __name__ == "__main__":
    main()
