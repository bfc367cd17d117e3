"""Slot reuse with a pending checkpoint: the time to first token of a request that takes
over a slot whose long session must be saved first, with disk KV on against off.

One round per configuration, on a fresh one-slot ds4d each: a long first prompt (a
passage of the test text, `--long-tokens`, 16 tokens of answer), then at once an unrelated
`--next-tokens` prompt, streamed, whose time to first token is the figure. With disk KV
the long prompt wrote a cold checkpoint during its prefill, and the next request makes
the slot save the rest (an evict save: a snapshot on the engine thread, written by the
background writer while the next prompt is prefilled); with `--no-kv-disk` nothing is
saved. The configurations alternate (A B B A ...), the same requests every time. Prints
each run with the daemon's own prefill time (its trace), the CPU time its process used
from the next request's sending to its first token (all threads, the writer's included:
on a loaded machine a steadier measure than seconds), the engine thread's time copying
sessions for the writer meanwhile (/metrics), the checkpoint writes pending when
the next request was sent and the bytes written by its first token, then the medians
and their ratio (target: within 10 %).

Usage: .venv/bin/python scripts/figures/reuse_ttft_figure.py [--rounds 3] [--long-tokens 6000]
       [--next-tokens 1500] [--ctx 8192] [-- extra ds4d serve flags for both]
A measuring tool, not a test: it prints figures with the load average.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parent))
from fair_prefill_figure import count_tokens  # noqa: E402
from figure_daemon import load, passage, split_serve_flags, started, stream_chat  # noqa: E402


def prompt_of(url: str, tokens: int, offset: int) -> str:
    words = tokens // 2
    for _ in range(3):
        words = max(1, round(words * tokens / count_tokens(url, passage(words, offset))))
    return passage(words, offset)


def run(config: str, args: argparse.Namespace, extra: list[str]) -> tuple[float, str]:
    flags = ["--slots", "1", "--threads", "2", "--ctx", str(args.ctx), "--trace", "{home}/trace.jsonl",
             *extra]  # fmt: skip
    if config == "no-disk":
        flags.append("--no-kv-disk")
    with started(*flags) as d:
        stream_chat(d.url, "Hello", 2)  # warm-up: pages in the weights
        long_text = prompt_of(d.url, args.long_tokens, 1000)
        next_text = prompt_of(d.url, args.next_tokens, 90000)
        first = httpx.post(
            f"{d.url}/v1/chat/completions",
            json={
                "model": "m",
                "max_tokens": 16,
                "temperature": 0,
                "messages": [{"role": "user", "content": long_text}],
            },  # fmt: skip
            timeout=3600,
        )
        first.raise_for_status()
        m = d.metrics()
        pending = int(m.get("ds4d_kv_disk_pending_writes", 0))
        written0 = m.get("ds4d_kv_disk_bytes_written_total", 0)
        copying0 = m.get("ds4d_kv_disk_snapshot_seconds_total", 0)
        cpu0 = d.cpu_seconds()
        nxt = stream_chat(d.url, next_text, 1)
        cpu = d.cpu_seconds() - cpu0
        m = d.metrics()
        trace = json.loads((d.home / "trace.jsonl").read_text().splitlines()[-1])
        written = int(m.get("ds4d_kv_disk_bytes_written_total", 0) - written0)
        copying = m.get("ds4d_kv_disk_snapshot_seconds_total", 0) - copying0
        line = (
            f"{config},{first.json()['usage']['prompt_tokens']},"
            f"{nxt.usage.get('prompt_tokens')},{nxt.usage.get('prompt_tokens_details')},"
            f"{nxt.ttft:.2f},{trace['prefill_s']:.2f},{cpu:.2f},{copying:.3f},{pending},{written},"
            f"{load()}"
        )
    return nxt.ttft, cpu, line


def main() -> None:
    argv, extra = split_serve_flags(sys.argv[1:])
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--long-tokens", type=int, default=6000)
    ap.add_argument("--next-tokens", type=int, default=1500)
    ap.add_argument("--ctx", type=int, default=8192)
    args = ap.parse_args(argv)
    print(f"# ds4d serve --slots 1 --threads 2 --ctx {args.ctx} {' '.join(extra)}; "
          f"load at start {load()}")  # fmt: skip
    print("config,long_prompt_tokens,next_prompt_tokens,next_cached,next_ttft_s,"
          "next_prefill_s_in_trace,daemon_cpu_s_to_first_token,snapshot_s,pending_writes_at_send,"
          "bytes_written_meanwhile,load1")  # fmt: skip
    ttft: dict[str, list[float]] = {"disk": [], "no-disk": []}
    cpu: dict[str, list[float]] = {"disk": [], "no-disk": []}
    for n in range(args.rounds):
        order = ["disk", "no-disk"] if n % 2 == 0 else ["no-disk", "disk"]
        for config in order:
            seconds, cpu_s, line = run(config, args, extra)
            ttft[config].append(seconds)
            cpu[config].append(cpu_s)
            print(line, flush=True)
    for name, values in (("TTFT", ttft), ("daemon CPU time to the first token", cpu)):
        a, b = statistics.median(values["disk"]), statistics.median(values["no-disk"])
        print(f"# next request's {name}, median of {args.rounds}: {a:.2f} s with disk KV, "
              f"{b:.2f} s without: {100 * (a / b - 1):+.1f} %")  # fmt: skip
    print(f"# load at end {load()}")


if __name__ == "__main__":
    main()
