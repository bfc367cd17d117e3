"""Prefill (and decode) of ds4d at each precision beside llama.cpp, same run, interleaved:
the round docs/integer-path.md asks for on a quiet machine.

Each round runs, for every model and context, `ds4d bench` once per precision and
llama.cpp (llama-cpp-python through `--peer-script`, a yardstick, never a dependency), in
turn; the best of the rounds is kept per engine, and the table gives each precision's
prefill and decode against llama.cpp's (ratios of bests). Every run records the 1-minute
load average as it starts.

    LLAMA_CPP_LIB_PATH=PEER_BUILD/bin .venv/bin/python scripts/figures/prefill_round.py \
        --peer-python PEER/bin/python --peer-script scripts/figures/llamacpp_speed.py \
        --model A.gguf [B.gguf ...] [--ctx 512 4096] [--precision exact int2] [--rounds 3] \
        [--bound]

A measuring tool, not a test: it prints figures and asserts nothing.
"""

from __future__ import annotations

import argparse
import csv
import functools
import json
import os
import re
import subprocess
import sys
import tempfile
from pathlib import Path

import gguf

REPO = Path(__file__).resolve().parents[2]
PROMPT = REPO / "tests" / "data" / "text" / "promessi_sposi.txt"


def ds4d(model: str, ctx: int, gen: int, threads: int, precision: str) -> tuple[float, float]:
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "bench.csv"
        argv = [sys.executable, "-m", "ds4d", "bench", "--model", model, "--prompt-file",
                str(PROMPT), "--ctx-start", str(ctx), "--ctx-max", str(ctx), "--gen-tokens",
                str(gen), "--threads", str(threads), "--precision", precision, "--csv",
                str(out)]  # fmt: skip
        subprocess.run(argv, check=True, stdout=subprocess.DEVNULL, cwd=REPO)
        with out.open() as f:
            row = next(csv.DictReader(f))
    return float(row["prefill_tps"]), float(row["gen_tps"])


@functools.cache  # parsing an 8B's GGUF takes seconds: once per model and context
def decode_bytes(model: str, ctx: int) -> int:
    """What one decode step at ctx positions reads: the weights (the token embedding only
    as the output head, when there is no output.weight) and K and V of every layer in f16."""
    r = gguf.GGUFReader(model)
    names = {t.name for t in r.tensors}
    tied = "output.weight" not in names
    weights = sum(int(t.n_bytes) for t in r.tensors if t.name != "token_embd.weight" or tied)
    arch = str(bytes(r.fields["general.architecture"].parts[-1]), "utf-8")

    def key(name: str) -> int:
        return int(r.fields[f"{arch}.{name}"].parts[-1][0])

    head_dim = (key("attention.key_length") if f"{arch}.attention.key_length" in r.fields
                else key("embedding_length") // key("attention.head_count"))  # fmt: skip
    return weights + ctx * 2 * key("block_count") * key("attention.head_count_kv") * head_dim * 2


def read_bound(n_bytes: int, threads: int) -> float:
    """The machine's read bandwidth now (bytes/s, huge pages), over a buffer of n_bytes."""
    argv = [sys.executable, "-m", "ds4d", "bench", "--bandwidth", "--bandwidth-mib",
            str(max(1, n_bytes >> 20)), "--threads", str(threads)]  # fmt: skip
    out = subprocess.run(argv, check=True, capture_output=True, text=True, cwd=REPO).stdout
    m = re.search(r"([0-9.]+) GB/s on huge pages", out)
    if m is None:
        raise SystemExit(f"no bandwidth in: {out!r}")
    return float(m.group(1)) * 1e9


def llamacpp(peer: str, script: str, model: str, ctx: int, gen: int,
             threads: int) -> tuple[float, float]:  # fmt: skip
    argv = [peer, script, model, str(PROMPT), str(threads), str(ctx), str(gen)]
    line = subprocess.run(argv, check=True, capture_output=True, text=True).stdout
    obj = json.loads(line.strip().splitlines()[-1])
    return float(obj["prefill_tps"]), float(obj["decode_tps"])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--peer-python", required=True, help="python with llama-cpp-python")
    ap.add_argument("--peer-script", required=True, help="llama.cpp timing script")
    ap.add_argument("--model", nargs="+", required=True)
    ap.add_argument("--ctx", type=int, nargs="+", default=[512, 4096])
    ap.add_argument("--precision", nargs="+", default=["exact", "int2"])
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--gen-tokens", type=int, default=32)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--bound", action="store_true",
                    help="measure the read bound before each run; decode GB/s against it")  # fmt: skip
    a = ap.parse_args()
    engines = [*a.precision, "llama.cpp"]
    best: dict[tuple[str, int, str], list[float]] = {}
    loads: dict[tuple[str, int], list[float]] = {}
    # per (model, ctx, engine): the best decode's share of the bound measured before its run
    shares: dict[tuple[str, int, str], float] = {}
    bounds: dict[tuple[str, int], list[float]] = {}
    for rnd in range(a.rounds):
        for model in a.model:
            for ctx in a.ctx:
                for engine in engines:
                    bound = read_bound(decode_bytes(model, ctx), a.threads) if a.bound else 0.0
                    load = os.getloadavg()[0]
                    loads.setdefault((model, ctx), []).append(load)
                    if engine == "llama.cpp":
                        pre, dec = llamacpp(a.peer_python, a.peer_script, model, ctx,
                                            a.gen_tokens, a.threads)  # fmt: skip
                    else:
                        pre, dec = ds4d(model, ctx, a.gen_tokens, a.threads, engine)
                    note = ""
                    if a.bound:
                        gbs = dec * decode_bytes(model, ctx + a.gen_tokens // 2)
                        bounds.setdefault((model, ctx), []).append(bound)
                        k = (model, ctx, engine)
                        shares[k] = max(shares.get(k, 0.0), gbs / bound)
                        note = f", {gbs / 1e9:.1f} GB/s of a {bound / 1e9:.1f} GB/s bound"
                    print(f"round {rnd + 1} {Path(model).name} ctx {ctx} {engine}: prefill "
                          f"{pre:.1f} t/s, decode {dec:.1f} t/s{note} (load {load:.1f})",
                          flush=True)  # fmt: skip
                    b = best.setdefault((model, ctx, engine), [0.0, 0.0])
                    b[0], b[1] = max(b[0], pre), max(b[1], dec)
    print("\n| model | ctx | engine | prefill t/s | vs llama.cpp | decode t/s | vs llama.cpp "
          "| load |\n|---|---|---|---|---|---|---|---|")  # fmt: skip
    for model in a.model:
        for ctx in a.ctx:
            peer = best[(model, ctx, "llama.cpp")]
            lo, hi = min(loads[(model, ctx)]), max(loads[(model, ctx)])
            for engine in engines:
                pre, dec = best[(model, ctx, engine)]
                print(f"| {Path(model).stem} | {ctx} | {engine} | {pre:.1f} | "
                      f"{pre / peer[0]:.2f}x | {dec:.1f} | {dec / peer[1]:.2f}x | "
                      f"{lo:.1f}-{hi:.1f} |")  # fmt: skip
    if a.bound:
        print("\n| model | ctx | engine | decode GB/s (best) | best share of its run's bound "
              "| bounds GB/s |\n|---|---|---|---|---|---|")  # fmt: skip
        for model in a.model:
            for ctx in a.ctx:
                bs = bounds[(model, ctx)]
                for engine in engines:
                    gbs = best[(model, ctx, engine)][1] * decode_bytes(
                        model, ctx + a.gen_tokens // 2
                    )
                    print(f"| {Path(model).stem} | {ctx} | {engine} | {gbs / 1e9:.1f} | "
                          f"{shares[(model, ctx, engine)]:.0%} | {min(bs) / 1e9:.1f}-"
                          f"{max(bs) / 1e9:.1f} |")  # fmt: skip


if __name__ == "__main__":
    main()
