"""Single-stream prefill and decode speed of ds4d beside llama.cpp on the same GGUFs, at
several context lengths, each decode as a fraction of the machine's read-bandwidth bound.

One round runs, for every context N, `ds4d bench` (prefill N prompt tokens, then
`--gen-tokens` greedy tokens) and llama.cpp timing the same prompt and count through
llama-cpp-python (a peer interpreter with llama-cpp-python installed, and its timing
script, both given on the command line: llama.cpp is a yardstick, not a dependency).
Engines alternate within a round and rounds repeat, so a noisy machine hurts both alike;
the best of the rounds is reported. A decode step reads every weight byte and the KV
rows of the context, so the bound at N is bandwidth / (weight bytes + the session's KV bytes, its
N prompt rows and the generated ones), the bandwidth measured by `ds4d bench --bandwidth` over the same threads; both engines keep
f16 KV by default, so one bound serves both.

The machine may be shared: every run records the 1-minute load average as it starts (which
includes the previous run's own threads), and each table row gives the range of those
loads over its runs, so a reader sees how quiet the machine was.

    .venv/bin/python scripts/figures/decode_figure.py --peer-python PEER/bin/python \
        --peer-script scripts/figures/llamacpp_speed.py [--model A.gguf B.gguf ...] [--ctx 512 4096 16384] \
        [--rounds 3] [--gen-tokens 64] [--threads 2] [--csv decode.csv] \
        [--plot docs/decode-bench.png] [--markdown table.md]

Several --model files are measured in one run (each model's rounds interleaved the same
way); the table, the CSV and the plot have one row (one bar group) per model and context.

A measuring tool, not a test: it prints figures and asserts nothing.
"""

from __future__ import annotations

import argparse
import csv
import json
import os
import re
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
PROMPT = REPO / "tests" / "data" / "text" / "promessi_sposi.txt"


@dataclass
class Run:
    model: str
    engine: str
    ctx: int
    round: int
    prefill_tps: float
    decode_tps: float
    kv_bytes: int
    load: float = 0.0  # the 1-minute load average as the run started


def ds4d_bench(model: str, ctx: int, gen: int, threads: int, rnd: int) -> Run:
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "bench.csv"
        argv = [sys.executable, "-m", "ds4d", "bench", "--prompt-file", str(PROMPT),
                "--ctx-start", str(ctx), "--ctx-max", str(ctx), "--gen-tokens", str(gen),
                "--threads", str(threads), "--csv", str(out)]  # fmt: skip
        if model:
            argv += ["--model", model]
        subprocess.run(argv, check=True, stdout=subprocess.DEVNULL, cwd=REPO)
        with out.open() as f:
            row = next(csv.DictReader(f))
    return Run(model, "ds4d", ctx, rnd, float(row["prefill_tps"]), float(row["gen_tps"]),
               int(row["kv_bytes"]))  # fmt: skip


def llamacpp(peer: str, script: str, model: str, ctx: int, gen: int, threads: int,
             rnd: int) -> Run:  # fmt: skip
    argv = [peer, script, model, str(PROMPT), str(threads), str(ctx), str(gen)]
    line = subprocess.run(argv, check=True, capture_output=True, text=True).stdout
    obj = json.loads(line.strip().splitlines()[-1])
    return Run(model, "llama.cpp", ctx, rnd, float(obj["prefill_tps"]), float(obj["decode_tps"]), 0)


def bandwidth(threads: int) -> float:
    argv = [sys.executable, "-m", "ds4d", "bench", "--bandwidth", "--threads", str(threads)]
    text = subprocess.run(argv, check=True, capture_output=True, text=True, cwd=REPO).stdout
    m = re.search(r"read bandwidth: ([0-9.]+) GB/s", text)
    if not m:
        raise SystemExit(f"unexpected `ds4d bench --bandwidth` output: {text!r}")
    return float(m.group(1)) * 1e9


def weight_bytes(model: str) -> int:
    """Bytes of tensor data a decode step reads: every tensor of the file but the token
    embedding table, of which a step reads one row (unless it doubles as the output head),
    and of a MoE's expert tensors (*_exps) only the share of the experts a token uses."""
    from gguf import GGUFReader

    reader = GGUFReader(model)
    names = {t.name for t in reader.tensors}
    arch = bytes(reader.fields["general.architecture"].parts[-1]).decode()
    used = reader.fields.get(f"{arch}.expert_used_count")
    count = reader.fields.get(f"{arch}.expert_count")
    share = 1.0
    if used is not None and count is not None:
        share = int(used.parts[-1][0]) / int(count.parts[-1][0])
    total = 0.0
    for t in reader.tensors:
        if t.name == "token_embd.weight" and "output.weight" in names:
            continue
        total += int(t.n_bytes) * (share if "_exps." in t.name else 1.0)
    return int(total)


@dataclass
class Row:
    model: str
    ctx: int
    ours: Run  # ds4d's best decode round
    peer: Run  # llama.cpp's best decode round
    pre_ours: float  # best prefill t/s of each engine
    pre_peer: float
    bound: float  # decode t/s at the read-bandwidth bound
    loads: tuple[float, float]  # the lowest and highest load average its runs started at


def best_rows(runs: list[Run], models: list[str], ctxs: list[int], bw: float) -> list[Row]:
    rows = []
    for model in models:
        weights = weight_bytes(model)
        for ctx in ctxs:
            mine = [r for r in runs if r.model == model and r.ctx == ctx]
            ours = max((r for r in mine if r.engine == "ds4d"), key=lambda r: r.decode_tps)
            peer = max((r for r in mine if r.engine == "llama.cpp"), key=lambda r: r.decode_tps)
            rows.append(Row(model, ctx, ours, peer,
                            max(r.prefill_tps for r in mine if r.engine == "ds4d"),
                            max(r.prefill_tps for r in mine if r.engine == "llama.cpp"),
                            bw / (weights + ours.kv_bytes),
                            (min(r.load for r in mine), max(r.load for r in mine))))  # fmt: skip
    return rows


def markdown(rows: list[Row]) -> str:
    lines = [
        "| model | context | ds4d prefill | llama.cpp prefill | ratio | ds4d decode | "
        "llama.cpp decode | ratio | bound | ds4d / bound | llama.cpp / bound | load average |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        o, p = r.ours.decode_tps, r.peer.decode_tps
        lines.append(
            f"| {Path(r.model).stem} | {r.ctx} | {r.pre_ours:.1f} | {r.pre_peer:.1f} | "
            f"{r.pre_ours / r.pre_peer:.2f}× | {o:.1f} | {p:.1f} | {o / p:.2f}× | "
            f"{r.bound:.1f} | {o / r.bound:.0%} | {p / r.bound:.0%} | "
            f"{r.loads[0]:.1f}–{r.loads[1]:.1f} |"
        )
    return "\n".join(lines) + "\n"


def plot(rows: list[Row], path: Path, title: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (ax_pre, ax_dec) = plt.subplots(1, 2, figsize=(max(7, 1.6 * len(rows)) * 1.6, 4.5))
    xs = list(range(len(rows)))
    labels = [f"{Path(r.model).stem}\n{r.ctx}" for r in rows]
    width = 0.28
    ax_dec.bar([x - width for x in xs], [r.bound for r in rows], width,
               label="read-bandwidth bound", color="#dddddd")  # fmt: skip
    ax_dec.bar(xs, [r.ours.decode_tps for r in rows], width, label="ds4d")
    ax_dec.bar([x + width for x in xs], [r.peer.decode_tps for r in rows], width,
               label="llama.cpp")  # fmt: skip
    ax_dec.set_ylabel("decode tokens/s (best of rounds)")
    ax_pre.bar([x - width / 2 for x in xs], [r.pre_ours for r in rows], width, label="ds4d")
    ax_pre.bar([x + width / 2 for x in xs], [r.pre_peer for r in rows], width,
               label="llama.cpp")  # fmt: skip
    ax_pre.set_ylabel("prefill tokens/s (best of rounds)")
    for ax in (ax_pre, ax_dec):
        ax.set_xticks(xs, labels, fontsize=7)
        ax.set_xlabel("model, context (tokens)")
        ax.legend(fontsize=8)
    fig.suptitle(title)
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--peer-python", required=True, help="python with llama-cpp-python")
    ap.add_argument("--peer-script", required=True, help="llama.cpp timing script")
    ap.add_argument("--model", nargs="+", default=[], help="GGUFs (default: the embedded model)")
    ap.add_argument("--ctx", type=int, nargs="+", default=[512, 4096, 16384])
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--gen-tokens", type=int, default=64)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--csv", type=Path)
    ap.add_argument("--plot", type=Path)
    ap.add_argument("--markdown", type=Path, help="write the table here too")
    args = ap.parse_args()

    models = args.model
    if not models:
        sys.path.insert(0, str(REPO))
        from ds4d.engine.default_model import default_model_path

        models = [str(default_model_path())]
    # The bound: the better of a measure before and after the rounds (another user of the
    # memory bus lowers it, nothing raises it).
    bws = [bandwidth(args.threads)]
    print(f"read bandwidth {bws[0] / 1e9:.1f} GB/s, load {os.getloadavg()[0]:.2f}", flush=True)
    runs: list[Run] = []
    for rnd in range(args.rounds):
        for model in models:
            for ctx in args.ctx:
                for engine in ("ds4d", "llama.cpp") if rnd % 2 == 0 else ("llama.cpp", "ds4d"):
                    load = os.getloadavg()[0]
                    if engine == "ds4d":
                        run = ds4d_bench(model, ctx, args.gen_tokens, args.threads, rnd)
                    else:
                        run = llamacpp(args.peer_python, args.peer_script, model, ctx,
                                       args.gen_tokens, args.threads, rnd)  # fmt: skip
                    run.load = load
                    runs.append(run)
                    print(f"round {rnd} {Path(model).stem} ctx {ctx:>6} {engine:>9}: prefill "
                          f"{run.prefill_tps:7.1f} decode {run.decode_tps:7.1f} t/s, load "
                          f"{load:.2f}", flush=True)  # fmt: skip
    bws.append(bandwidth(args.threads))
    bw = max(bws)
    print(f"\nread bandwidth {bws[1] / 1e9:.1f} GB/s, load {os.getloadavg()[0]:.2f}; bound from "
          f"{bw / 1e9:.1f} GB/s ({args.threads} threads)")  # fmt: skip
    rows = best_rows(runs, models, args.ctx, bw)
    table = markdown(rows)
    print(table)
    if args.markdown:
        args.markdown.write_text(table)
    if args.csv:
        with args.csv.open("w", newline="") as f:
            w = csv.writer(f)
            w.writerow(["model", "engine", "ctx", "round", "prefill_tps", "decode_tps",
                        "bound_tps", "bandwidth_gbs", "load"])  # fmt: skip
            for r in runs:
                bound = next(x.bound for x in rows if x.model == r.model and x.ctx == r.ctx)
                w.writerow([Path(r.model).name, r.engine, r.ctx, r.round, f"{r.prefill_tps:.2f}",
                            f"{r.decode_tps:.2f}", f"{bound:.2f}", f"{bw / 1e9:.2f}",
                            f"{r.load:.2f}"])  # fmt: skip
    if args.plot:
        plot(rows, args.plot, f"ds4d and llama.cpp, {args.threads} threads, best of "
             f"{args.rounds}, read bound {bw / 1e9:.1f} GB/s")  # fmt: skip


if __name__ == "__main__":
    main()
