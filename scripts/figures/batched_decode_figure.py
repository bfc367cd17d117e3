"""Aggregate decode tokens/s of K concurrent streams against one, at the HTTP level, on a
real ds4d (batched decode: one engine call advances every generating slot).

Each round starts K streaming greedy completions at once (`/v1/completions`, a counting
prompt the model continues for the whole budget) and times every token's arrival. A
stream's decode rate is (tokens - 1) / (its last token - its first token); the aggregate is
the sum over the K streams, which overlap almost entirely (they start together with the
same budget; the overlap is printed). The mean batch size comes from /metrics.

Usage: .venv/bin/python scripts/figures/batched_decode_figure.py [--streams 1,2,4] [--tokens 128]
       [--rounds 3] [--threads 2] [--url http://127.0.0.1:8000]
Without --url it starts ds4d (`--slots` = the largest K, the embedded model, no disk KV)
on an ephemeral port. A measuring tool, not a test: it prints figures, asserts nothing.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import httpx

from ds4d.tools.serve_process import ServeProcessError, private_env, serve_process

BIN = Path(sys.executable).parent


@contextmanager
def started_daemon(slots: int, threads: int) -> Iterator[str]:
    with tempfile.TemporaryDirectory() as tmp:
        dirs = {var: Path(tmp) for var in ("XDG_RUNTIME_DIR", "XDG_CACHE_HOME", "XDG_STATE_HOME")}
        args = ["--slots", str(slots), "--threads", str(threads), "--ctx", "2048", "--no-kv-disk"]
        try:
            with serve_process(args, env=private_env(dirs), log_path=Path(tmp) / "ds4d.log",
                               start_timeout=600) as daemon:  # fmt: skip
                yield daemon.url
        except ServeProcessError as e:
            raise SystemExit(str(e)) from None


def stream(url: str, prompt: str, tokens: int) -> list[float]:
    """The arrival time of every streamed chunk (one per token: the prompt is digits)."""
    body = {"model": "m", "prompt": prompt, "max_tokens": tokens, "temperature": 0,
            "stream": True}  # fmt: skip
    times = []
    with httpx.stream("POST", f"{url}/v1/completions", json=body, timeout=600) as r:
        r.raise_for_status()
        for line in r.iter_lines():
            if line.startswith("data: ") and line != "data: [DONE]":
                if json.loads(line[6:])["choices"][0].get("text"):
                    times.append(time.perf_counter())
    return times


def metric(url: str, name: str) -> float:
    for line in httpx.get(f"{url}/metrics").text.splitlines():
        if line.startswith(name + " "):
            return float(line.split()[1])
    raise KeyError(name)


def round_(url: str, k: int, tokens: int) -> tuple[float, float, float]:
    """(aggregate decode tokens/s, overlap share, mean batch) of k concurrent streams."""
    prompts = [f"Count from {100 * (i + 1)}: {', '.join(str(100 * (i + 1) + j) for j in range(6))},"
               for i in range(k)]  # fmt: skip
    steps0 = metric(url, "ds4d_decode_steps_total")
    slots0 = metric(url, "ds4d_decode_step_slots_total")
    times: list[list[float]] = [[] for _ in range(k)]
    barrier = threading.Barrier(k)

    def client(i: int) -> None:
        barrier.wait()
        times[i] = stream(url, prompts[i], tokens)

    threads = [threading.Thread(target=client, args=(i,)) for i in range(k)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    rate = sum((len(ts) - 1) / (ts[-1] - ts[0]) for ts in times)
    window = min(ts[-1] for ts in times) - max(ts[0] for ts in times)
    overlap = window / max(ts[-1] - ts[0] for ts in times)
    steps = metric(url, "ds4d_decode_steps_total") - steps0
    slots = metric(url, "ds4d_decode_step_slots_total") - slots0
    return rate, overlap, slots / steps


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--streams", default="1,4")
    ap.add_argument("--tokens", type=int, default=128)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--url")
    args = ap.parse_args()
    ks = [int(k) for k in args.streams.split(",")]

    def measure(url: str) -> None:
        round_(url, max(ks), 8)  # warm-up: pages in the weights
        base = None
        print("streams,aggregate_tokens_per_s,median_of,overlap,mean_batch,vs_one")
        for k in ks:
            runs = [round_(url, k, args.tokens) for _ in range(args.rounds)]
            rate = statistics.median(r[0] for r in runs)
            base = rate if k == 1 else base
            ratio = f"{rate / base:.2f}" if base else ""
            print(
                f"{k},{rate:.1f},{args.rounds},{min(r[1] for r in runs):.2f},"
                f"{statistics.median(r[2] for r in runs):.2f},{ratio}",
                flush=True,
            )

    if args.url:
        measure(args.url)
    else:
        with started_daemon(max(ks), args.threads) as url:
            measure(url)


if __name__ == "__main__":
    main()
