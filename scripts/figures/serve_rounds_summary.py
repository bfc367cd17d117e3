"""Summarises the rounds of scripts/figures/serve_rounds.sh: for each client count K, every
tree's median tokens/s and inter-token p95 (and p99, where the CSV has it) over the rounds,
and for each pair of trees the median of the per-round ratios and how many rounds the second
tree's p95 (p99) was higher. A round
is the runs labelled NAME-N with the same N (they ran back to back, so under about the same
load); a round missing a tree's row is left out of that pair's ratios. Rounds of
different CSV files are different rounds, whatever their numbers.

    python3 scripts/figures/serve_rounds_summary.py CSV [CSV ...] --trees before,main,branch

A measuring aid, not a test: it prints figures, asserts nothing.
"""

from __future__ import annotations

import argparse
import csv
import statistics
from collections import defaultdict
from itertools import combinations


def load(paths: list[str]) -> dict[tuple[str, int, str], dict[str, float]]:
    """(tree, K, round) -> {"tps": gen tokens/s, "p95": inter-token p95 in ms, and "p99"
    in ms when the CSV has it}."""
    rows: dict[tuple[str, int, str], dict[str, float]] = {}
    for i, path in enumerate(paths):
        with open(path, newline="") as f:
            for r in csv.DictReader(f):
                tree, _, rnd = r["label"].rpartition("-")
                row = {"tps": float(r["gen_tps"]), "p95": float(r["itl_p95_s"]) * 1e3}
                if r.get("itl_p99_s"):
                    row["p99"] = float(r["itl_p99_s"]) * 1e3
                rows[(tree, int(r["clients"]), f"{i}:{rnd}")] = row
    return rows


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("csv", nargs="+")
    ap.add_argument("--trees", required=True, help="tree names, comma-separated, as labelled")
    args = ap.parse_args()
    trees = args.trees.split(",")
    rows = load(args.csv)
    by_k: dict[int, dict[str, dict[str, dict[str, float]]]] = defaultdict(lambda: defaultdict(dict))
    for (tree, k, rnd), v in rows.items():
        if tree in trees:
            by_k[k][tree][rnd] = v
    for k in sorted(by_k):
        print(f"K = {k}")
        for tree in trees:
            runs = by_k[k][tree]
            if runs:
                tps = statistics.median(v["tps"] for v in runs.values())
                p95 = statistics.median(v["p95"] for v in runs.values())
                p99s = [v["p99"] for v in runs.values() if "p99" in v]
                p99 = f", p99 {statistics.median(p99s):.1f} ms" if p99s else ""
                print(
                    f"  {tree:>8}: {len(runs)} runs, median {tps:.2f} tok/s, p95 {p95:.1f} ms{p99}"
                )
        for a, b in combinations(trees, 2):
            common = sorted(set(by_k[k][a]) & set(by_k[k][b]))
            if not common:
                continue
            tps_r = [by_k[k][b][r]["tps"] / by_k[k][a][r]["tps"] for r in common]
            p95_r = [by_k[k][b][r]["p95"] / by_k[k][a][r]["p95"] for r in common]
            worse = sum(x > 1 for x in p95_r)
            print(
                f"  {b} / {a}: {len(common)} rounds, tok/s ratio median "
                f"{statistics.median(tps_r):.3f} (range {min(tps_r):.2f}-{max(tps_r):.2f}), "
                f"p95 ratio median {statistics.median(p95_r):.3f} "
                f"(range {min(p95_r):.2f}-{max(p95_r):.2f}), "
                f"{b}'s p95 higher in {worse} / {len(common)}"
            )
            with99 = [r for r in common if "p99" in by_k[k][a][r] and "p99" in by_k[k][b][r]]
            if with99:
                p99_r = [by_k[k][b][r]["p99"] / by_k[k][a][r]["p99"] for r in with99]
                print(
                    f"  {b} / {a}: p99 ratio median {statistics.median(p99_r):.3f} "
                    f"(range {min(p99_r):.2f}-{max(p99_r):.2f}), "
                    f"{b}'s p99 higher in {sum(x > 1 for x in p99_r)} / {len(with99)}"
                )


if __name__ == "__main__":
    main()
