"""Single-stream decode speed of ds4d beside llama.cpp on the same GGUF, at several
context lengths, each as a fraction of the machine's read-bandwidth bound.

One round runs, for every context N, `ds4d bench` (prefill N prompt tokens, then
`--gen-tokens` greedy tokens) and llama.cpp timing the same prompt and count through
llama-cpp-python (a peer interpreter with llama-cpp-python installed, and its timing
script, both given on the command line: llama.cpp is a yardstick, not a dependency).
Engines alternate within a round and rounds repeat, so a noisy machine hurts both alike;
the best of the rounds is reported. A decode step reads every weight byte and the KV
rows of the context, so the bound at N is bandwidth / (weight bytes + the session's KV bytes, its
N prompt rows and the generated ones), the bandwidth measured by `ds4d bench --bandwidth` over the same threads; both engines keep
f16 KV by default, so one bound serves both.

    .venv/bin/python scripts/figures/decode_figure.py --peer-python PEER/bin/python \
        --peer-script scripts/figures/llamacpp_speed.py [--ctx 512 4096 16384] [--rounds 3] \
        [--gen-tokens 64] [--threads 2] [--csv decode.csv] [--plot docs/decode-bench.png]

A measuring tool, not a test: it prints figures and asserts nothing.
"""

from __future__ import annotations

import argparse
import csv
import json
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
    engine: str
    ctx: int
    round: int
    prefill_tps: float
    decode_tps: float
    kv_bytes: int


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
    return Run("ds4d", ctx, rnd, float(row["prefill_tps"]), float(row["gen_tps"]),
               int(row["kv_bytes"]))  # fmt: skip


def llamacpp(peer: str, script: str, model: str, ctx: int, gen: int, threads: int,
             rnd: int) -> Run:  # fmt: skip
    argv = [peer, script, model, str(PROMPT), str(threads), str(ctx), str(gen)]
    line = subprocess.run(argv, check=True, capture_output=True, text=True).stdout
    obj = json.loads(line.strip().splitlines()[-1])
    return Run("llama.cpp", ctx, rnd, float(obj["prefill_tps"]), float(obj["decode_tps"]), 0)


def bandwidth(threads: int) -> float:
    argv = [sys.executable, "-m", "ds4d", "bench", "--bandwidth", "--threads", str(threads)]
    text = subprocess.run(argv, check=True, capture_output=True, text=True, cwd=REPO).stdout
    m = re.search(r"read bandwidth: ([0-9.]+) GB/s", text)
    if not m:
        raise SystemExit(f"unexpected `ds4d bench --bandwidth` output: {text!r}")
    return float(m.group(1)) * 1e9


def weight_bytes(model: str) -> int:
    """Bytes of tensor data a decode step reads: every tensor of the file but the token
    embedding table, of which a step reads one row (unless it doubles as the output head)."""
    from gguf import GGUFReader

    reader = GGUFReader(model)
    names = {t.name for t in reader.tensors}
    total = 0
    for t in reader.tensors:
        if t.name == "token_embd.weight" and "output.weight" in names:
            continue
        total += int(t.n_bytes)
    return total


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--peer-python", required=True, help="python with llama-cpp-python")
    ap.add_argument("--peer-script", required=True, help="llama.cpp timing script")
    ap.add_argument("--model", default="", help="GGUF (default: the embedded model)")
    ap.add_argument("--ctx", type=int, nargs="+", default=[512, 4096, 16384])
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--gen-tokens", type=int, default=64)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--csv", type=Path)
    ap.add_argument("--plot", type=Path)
    args = ap.parse_args()

    model = args.model
    if not model:
        sys.path.insert(0, str(REPO))
        from ds4d.engine.default_model import default_model_path

        model = str(default_model_path())
    runs: list[Run] = []
    for rnd in range(args.rounds):
        for ctx in args.ctx:
            for engine in ("ds4d", "llama.cpp") if rnd % 2 == 0 else ("llama.cpp", "ds4d"):
                if engine == "ds4d":
                    run = ds4d_bench(args.model, ctx, args.gen_tokens, args.threads, rnd)
                else:
                    run = llamacpp(args.peer_python, args.peer_script, model, ctx,
                                   args.gen_tokens, args.threads, rnd)  # fmt: skip
                runs.append(run)
                print(f"round {rnd} ctx {ctx:>6} {engine:>9}: prefill {run.prefill_tps:7.1f} "
                      f"decode {run.decode_tps:7.1f} t/s", flush=True)  # fmt: skip
    bw = bandwidth(args.threads)
    weights = weight_bytes(model)
    print(f"\nread bandwidth {bw / 1e9:.1f} GB/s, weights read per token {weights / 1e6:.1f} MB")
    print("| context | ds4d decode | llama.cpp decode | ratio | bound | ds4d / bound | "
          "llama.cpp / bound | ds4d prefill | llama.cpp prefill |")  # fmt: skip
    print("|---|---|---|---|---|---|---|---|---|")
    rows = []
    for ctx in args.ctx:
        ours = max((r for r in runs if r.engine == "ds4d" and r.ctx == ctx),
                   key=lambda r: r.decode_tps)  # fmt: skip
        peer = max((r for r in runs if r.engine == "llama.cpp" and r.ctx == ctx),
                   key=lambda r: r.decode_tps)  # fmt: skip
        pre_ours = max(r.prefill_tps for r in runs if r.engine == "ds4d" and r.ctx == ctx)
        pre_peer = max(r.prefill_tps for r in runs if r.engine == "llama.cpp" and r.ctx == ctx)
        bound = bw / (weights + ours.kv_bytes)
        rows.append((ctx, ours.decode_tps, peer.decode_tps, bound))
        print(f"| {ctx} | {ours.decode_tps:.1f} | {peer.decode_tps:.1f} | "
              f"{ours.decode_tps / peer.decode_tps:.2f}× | {bound:.0f} | "
              f"{ours.decode_tps / bound:.0%} | {peer.decode_tps / bound:.0%} | "
              f"{pre_ours:.0f} | {pre_peer:.0f} |")  # fmt: skip
    if args.csv:
        with args.csv.open("w", newline="") as f:
            w = csv.writer(f)
            w.writerow(["engine", "ctx", "round", "prefill_tps", "decode_tps", "bound_tps"])
            for r in runs:
                bound = next(b for c, _, _, b in rows if c == r.ctx)
                w.writerow([r.engine, r.ctx, r.round, f"{r.prefill_tps:.2f}",
                            f"{r.decode_tps:.2f}", f"{bound:.2f}"])  # fmt: skip
    if args.plot:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt

        fig, ax = plt.subplots(figsize=(7, 4))
        xs = range(len(rows))
        width = 0.28
        ax.bar([x - width for x in xs], [r[3] for r in rows], width, label="read-bandwidth bound",
               color="#dddddd")  # fmt: skip
        ax.bar(list(xs), [r[1] for r in rows], width, label="ds4d")
        ax.bar([x + width for x in xs], [r[2] for r in rows], width, label="llama.cpp")
        ax.set_xticks(list(xs), [f"{r[0]}" for r in rows])
        ax.set_xlabel("context (tokens)")
        ax.set_ylabel("decode tokens/s (best of rounds)")
        ax.set_title(f"single-stream decode, {args.threads} threads, {bw / 1e9:.1f} GB/s bound")
        ax.legend()
        fig.tight_layout()
        fig.savefig(args.plot, dpi=110)


if __name__ == "__main__":
    main()
