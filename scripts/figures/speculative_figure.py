"""Decode tokens/s with speculative decoding (prompt lookup) on and off, on agent-shaped
workloads, through a real ds4d over HTTP.

One daemon per model, started with `--speculative lookup`; each round sends every workload
twice, once with `"speculative": false` (the request's opt-out: one pass per token) and once
without, alternating which goes first, so both see the same machine and load. Each request
is a greedy chat completion; its decode rate is the daemon's own count, read from
/metrics before and after (generated tokens / decode seconds), and so are the drafted and
accepted tokens. The two outputs must be the same text (the script says so when not):
both start from the same KV state (a one-token request of the same prompt just before,
so each reuses the whole prompt from the slot).

Workloads:
  rewrite  rewrite a file given in the prompt with one change (a source file of this
           checkout): most of the output copies the prompt
  edit     an edit's old_string / new_string pair for a function of that file
  prose    continue a story (drafts mostly fail: the cost of trying)

Usage: .venv/bin/python scripts/figures/speculative_figure.py [--rounds 3] [--tokens 256]
       [--csv docs/speculative-bench.csv] [--model PATH]... [-- ds4d serve flags]
Without --model: the embedded model. A measuring tool, not a test: it prints figures
(with the load average and the CPU beside them) and asserts nothing.
"""

from __future__ import annotations

import argparse
import csv
import platform
import sys
from pathlib import Path

import httpx
from figure_daemon import Daemon, load, passage, split_serve_flags, started

ROOT = Path(__file__).resolve().parents[2]
FILE = (ROOT / "ds4d" / "serving" / "chunking.py").read_text()

WORKLOADS = {
    "rewrite": (
        "Here is a Python file:\n\n```python\n" + FILE + "```\n\n"
        "Rewrite the whole file with one change: rename the class ChunkSizer to "
        "PrefillSizer. Output only the complete new file."
    ),
    "edit": (
        "Here is a Python file:\n\n```python\n" + FILE + "```\n\n"
        "Give the edit that adds a docstring line to the method `size`, as JSON "
        'with the keys "old_string" (the exact lines of the file to replace) and '
        '"new_string".'
    ),
    "prose": "Continue this story in English:\n\n" + passage(120, 500),
}


def cpu_name() -> str:
    for line in Path("/proc/cpuinfo").read_text().splitlines():
        if line.startswith("model name"):
            return line.split(":", 1)[1].strip()
    return platform.processor() or "unknown"


def one(d: Daemon, prompt: str, tokens: int, speculative: bool) -> dict[str, float | str]:
    before = d.metrics()
    body = {
        "model": "m",
        "messages": [{"role": "user", "content": prompt}],
        "max_tokens": tokens,
        "temperature": 0,
        "speculative": speculative,
    }
    r = httpx.post(f"{d.url}/v1/chat/completions", json=body, timeout=1800)
    r.raise_for_status()
    after = d.metrics()

    def delta(name: str) -> float:
        return after.get(name, 0.0) - before.get(name, 0.0)

    generated = delta("ds4d_generated_tokens_total")
    seconds = delta("ds4d_decode_seconds_total")
    return {
        "text": r.json()["choices"][0]["message"]["content"] or "",
        "generated": generated,
        "decode_s": seconds,
        "tok_s": generated / seconds if seconds else float("nan"),
        "drafted": delta("ds4d_speculative_drafted_tokens_total"),
        "accepted": delta("ds4d_speculative_accepted_tokens_total"),
    }


def main() -> None:
    own, serve_flags = split_serve_flags(sys.argv[1:])
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--tokens", type=int, default=256)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--model", action="append", default=[])
    ap.add_argument("--csv", type=Path)
    args = ap.parse_args(own)
    cpu = cpu_name()
    print(f"cpu: {cpu}; threads {args.threads}; {args.tokens} tokens a request, greedy")
    rows = []
    for model in args.model or [""]:
        flags = ["--speculative", "lookup", "--slots", "1", "--ctx", "4096", "--no-kv-disk",
                 "--threads", str(args.threads)]  # fmt: skip
        if model:
            flags += ["--model", model]
        name = Path(model).name if model else "embedded (SmolLM2-135M)"
        with started(*flags, *serve_flags) as d:
            for rnd in range(args.rounds):
                for workload, prompt in WORKLOADS.items():
                    # Both runs must start from the same KV state: a prompt prefilled to
                    # its end and one reused from the slot give last-bit different
                    # logits (the prefill matmul against a decode step), which can change
                    # a greedy text as much as anything. A one-token request first, so
                    # each run reuses the whole prompt.
                    one(d, prompt, 1, False)
                    order = [False, True] if rnd % 2 == 0 else [True, False]
                    got = {spec: one(d, prompt, args.tokens, spec) for spec in order}
                    off, on = got[False], got[True]
                    same = off["text"] == on["text"]
                    rate = on["accepted"] / on["drafted"] if on["drafted"] else 0.0
                    speedup = float(on["tok_s"]) / float(off["tok_s"])
                    print(f"{name} {workload} round {rnd}: off {off['tok_s']:.1f} tok/s, "
                          f"lookup {on['tok_s']:.1f} tok/s (x{speedup:.2f}), drafted "
                          f"{on['drafted']:.0f} accepted {on['accepted']:.0f} ({rate:.0%}), "
                          f"{on['generated']:.0f} tokens, same output: {same}, load {load()}",
                          flush=True)  # fmt: skip
                    rows.append({
                        "model": name, "workload": workload, "round": rnd,
                        "tokens": int(on["generated"]),
                        "off_tok_s": f"{off['tok_s']:.2f}", "lookup_tok_s": f"{on['tok_s']:.2f}",
                        "speedup": f"{speedup:.3f}", "drafted": int(on["drafted"]),
                        "accepted": int(on["accepted"]), "same_output": same,
                        "load": load(), "cpu": cpu,
                    })  # fmt: skip
    if args.csv is not None:
        with args.csv.open("w", newline="") as f:
            w = csv.DictWriter(f, fieldnames=list(rows[0]))
            w.writeheader()
            w.writerows(rows)
        print(f"wrote {args.csv}")


if __name__ == "__main__":
    main()
