"""Fair prefill in seconds: while one slot prefills a long prompt, how soon a short request
on the other slot gets its first token and its last.

Each round sends a ~6000-token prompt (a passage of the test text, a different one every
round, max_tokens 1) and, while it is being prefilled, one short request after another
(a one-line question, greedy, `--short-tokens` tokens), each sent once the long slot holds
at least the next of `--at` tokens (its KV growing chunk by chunk in /metrics). Prints per
short request its time to first token and to its last token, and the depth of the long
prefill when it was sent and when it ended (the long prefill must still be running: else
the figure proves nothing, and the line says so).

Usage: .venv/bin/python scripts/figures/fair_prefill_figure.py [--rounds 3] [--long-tokens 6000]
       [--short-tokens 20] [--at 1000,3000,5000] [-- extra ds4d serve flags]
Run with another checkout's python to measure that checkout's ds4d (A/B). It starts ds4d itself (`--slots 2 --threads 2 --ctx 8192`, the embedded model, disk KV in
a temporary directory) on an ephemeral port. The target: first token within 1 s, last
within 3 s. A measuring tool, not a test: it prints figures with the load average.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import threading
import time
from pathlib import Path

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parent))
from figure_daemon import Daemon, Timed, load, passage, split_serve_flags, started, stream_chat  # noqa: E402

QUESTIONS = [
    "Write a long story about a dragon.",
    "Describe the sea at night in many words.",
    "Tell me everything about the history of bread.",
    "Explain at length how a bicycle works.",
]


def count_tokens(url: str, content: str) -> int:
    body = {"model": "m", "max_tokens": 1, "messages": [{"role": "user", "content": content}]}
    r = httpx.post(f"{url}/v1/messages/count_tokens", json=body, timeout=60)
    r.raise_for_status()
    return int(r.json()["input_tokens"])


def long_prompt(url: str, tokens: int, offset: int) -> str:
    """A passage of about `tokens` tokens (the word count scaled from a first count)."""
    words = tokens // 2
    for _ in range(3):
        n = count_tokens(url, passage(words, offset))
        words = max(1, round(words * tokens / n))
    return passage(words, offset)


def slot_depths(d: Daemon) -> dict[int, tuple[bool, int]]:
    m = d.metrics()
    out = {}
    for key, value in m.items():
        if key.startswith('ds4d_slot_tokens{slot="'):
            i = int(key.split('"')[1])
            out[i] = (m.get(f'ds4d_slot_busy{{slot="{i}"}}', 0) == 1, int(value))
    return out


def one_round(d: Daemon, n: int, args: argparse.Namespace) -> list[str]:
    prompt = long_prompt(d.url, args.long_tokens, offset=7919 * (n + 1))
    result: list[Timed] = []
    failure: list[BaseException] = []

    def long_request() -> None:
        try:
            result.append(stream_chat(d.url, prompt, 1))
        except BaseException as e:  # reported below
            failure.append(e)

    thread = threading.Thread(target=long_request)
    thread.start()
    lines = []
    long_slot = None
    for k, at in enumerate(args.at):
        while True:  # until the long slot holds `at` tokens
            if not thread.is_alive():
                break
            busy = [(i, t) for i, (b, t) in slot_depths(d).items() if b]
            if long_slot is None and len(busy) == 1 and busy[0][1] > 0:
                long_slot = busy[0][0]
            if long_slot is not None and slot_depths(d)[long_slot][1] >= at:
                break
            time.sleep(0.05)  # polling another process's metrics
        if not thread.is_alive() or long_slot is None:
            lines.append(f"{n},{at},,,,,,long prefill ended first: no figure")
            break
        before = slot_depths(d)[long_slot][1]
        question = QUESTIONS[(n + k) % len(QUESTIONS)] + f" ({n}.{k})"
        short = stream_chat(d.url, question, args.short_tokens)
        after = slot_depths(d)[long_slot][1]
        still = thread.is_alive()
        lines.append(
            f"{n},{at},{before},{after},{short.ttft:.2f},{short.total:.2f},"
            f"{short.usage.get('completion_tokens', 0)},"
            f"{'' if still else 'long prefill ended first'},{load()}"
        )
        print(lines[-1], flush=True)
    thread.join()
    if failure:
        raise failure[0]
    done = result[0]
    print(f"# round {n}: the long prompt, {done.usage.get('prompt_tokens')} tokens, answered "
          f"in {done.total:.1f} s (its prefill with the short requests beside it); load "
          f"{load()}", flush=True)  # fmt: skip
    return lines


def main() -> None:
    argv, extra = split_serve_flags(sys.argv[1:])
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--long-tokens", type=int, default=6000)
    ap.add_argument("--short-tokens", type=int, default=20)
    ap.add_argument("--at", default="1000,3000,5000",
                    type=lambda s: [int(x) for x in s.split(",")])  # fmt: skip
    args = ap.parse_args(argv)
    flags = ["--slots", "2", "--threads", "2", "--ctx", "8192", *extra]
    print(f"# ds4d serve {' '.join(flags)}; load at start {load()}")
    with started(*flags) as d:
        stream_chat(d.url, "Hello", 4)  # warm-up: pages in the weights
        print("round,sent_at_depth,long_depth_at_send,long_depth_at_end,ttft_s,total_s,"
              "completion_tokens,note,load1")  # fmt: skip
        ttft, total = [], []
        for n in range(args.rounds):
            for line in one_round(d, n, args):
                cols = line.split(",")
                if cols[4] and not cols[7]:
                    ttft.append(float(cols[4]))
                    total.append(float(cols[5]))
    if ttft:
        print(f"# {len(ttft)} short requests: ttft median {statistics.median(ttft):.2f} s, "
              f"max {max(ttft):.2f} s; total median {statistics.median(total):.2f} s, "
              f"max {max(total):.2f} s; load at end {load()}")  # fmt: skip


if __name__ == "__main__":
    main()
