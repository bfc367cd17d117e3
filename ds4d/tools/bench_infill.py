"""`ds4d bench infill`: replays an editing session against running servers' `/infill` and
reports, per request, the prompt's tokens, the tokens reused from the server's cache, the
time to first token and the total time; p50/p95 per server; a CSV and a plot.

The session is a function of the source file and the options alone, so every server gets
the same requests: llama.vim's pattern, as its documentation and code describe it. The
cursor sits in a real source file (by default one of ds4d's own) with up to
--prefix-tokens of file before it and --suffix-lines after it; the line at the cursor is
typed again character by character (with backspaces over a few characters, retyped), the
cursor jumps back a few lines once and returns; context chunks from other files
(--chunk-lines lines each) arrive as the ring buffer sends them, each arrival followed by
a warm-up request (`n_predict: 0`), and the first request is a warm-up too.

Generation is fixed (--n-predict, greedy, no stop rules): random-weight models are fine
for latency. Time to first token is measured by the client, from sending the request to
the first streamed piece of text (a request whose first piece is empty or that generates
nothing counts its whole time). Servers run interleaved request by request (request i goes
to A, B, C, request i+1 to B, C, A, ...), so a machine whose load changes during a long
replay slows every server alike; `--interleave server` runs one server's whole replay,
then the next's. There are --rounds rounds; each starts cold for every server (a round
tag leads the first chunk).

The client is plain http.client, a connection per request.
"""

from __future__ import annotations

import argparse
import csv
import http.client
import importlib.util
import json
import math
import time
import urllib.parse
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ds4d.daemon.exitcodes import CliError

CSV_FIELDS = ("label", "round", "index", "kind", "prompt_tokens", "reused_tokens",
              "evaluated_tokens", "predicted_tokens", "ttft_s", "total_s")  # fmt: skip
DEFAULT_FILE = Path(__file__).resolve().parents[1] / "serving" / "loop.py"
CHARS_PER_TOKEN = 3.5  # code, roughly: how many characters of prefix to take


@dataclass(frozen=True)
class Request:
    kind: str  # "warm", "key", "back" (the cursor jumped), "return"
    body: dict[str, Any]


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--server", action="append", required=True, metavar="LABEL=URL",
                   help="a running server (repeat: they run interleaved)")  # fmt: skip
    p.add_argument("--file", type=Path, default=DEFAULT_FILE, help="the source file typed in")
    p.add_argument("--prefix-tokens", type=int, default=4096,
                   help="about how much file is before the cursor")  # fmt: skip
    p.add_argument("--suffix-lines", type=int, default=64)
    p.add_argument("--chunks", type=int, default=8, help="extra context chunks in all")
    p.add_argument("--chunk-lines", type=int, default=32)
    p.add_argument("--keystrokes", type=int, default=100)
    p.add_argument("--n-predict", type=int, default=8)
    p.add_argument("--rounds", type=int, default=2)
    p.add_argument("--interleave", choices=("request", "server"), default="request",
                   help="take turns per request (default) or per whole replay")  # fmt: skip
    p.add_argument("--csv", type=Path, help="append per-request rows here")
    p.add_argument("--plot", type=Path, help="PNG of time to first token per request")
    p.add_argument("--timeout", type=float, default=600)


# ---- the session ------------------------------------------------------------------------


def chunk_sources(source: Path, n: int, lines: int) -> list[dict[str, str]]:
    """Chunks of the other files beside `source` (sorted by name, then by position)."""
    files = sorted(p for p in source.parent.glob("*.py") if p != source)
    out: list[dict[str, str]] = []
    for f in files:
        text = f.read_text(encoding="utf-8").splitlines(keepends=True)
        for start in range(0, len(text), lines):
            out.append({"filename": str(f.name), "text": "".join(text[start : start + lines])})
            break  # one chunk per file: as many files as chunks
        if len(out) == n:
            break
    if len(out) < n:
        raise CliError(f"{source.parent} has too few files for {n} chunks", 2)
    return out


def session(args: argparse.Namespace, round_tag: str) -> list[Request]:
    lines = args.file.read_text(encoding="utf-8").splitlines(keepends=True)
    budget = int(args.prefix_tokens * CHARS_PER_TOKEN)
    # the cursor line: the first non-blank line after `budget` characters of file
    at, size = 0, 0
    while at < len(lines) and (size < budget or not lines[at].strip()):
        size += len(lines[at])
        at += 1
    if at + args.suffix_lines >= len(lines):
        raise CliError(f"{args.file} is too short for that prefix and suffix", 2)
    target = lines[at].rstrip("\n")
    before, after = lines[:at], lines[at + 1 : at + 1 + args.suffix_lines]
    chunks = chunk_sources(args.file, args.chunks, args.chunk_lines)
    chunks[0] = {**chunks[0], "text": f"# {round_tag}\n" + chunks[0]["text"]}
    sent = args.chunks - 2  # two chunks arrive during the session
    arrivals = {args.keystrokes // 3: sent + 1, 2 * args.keystrokes // 3: sent + 2}
    fixed = {"n_predict": args.n_predict, "cache_prompt": True, "temperature": 0,
             "top_k": 1, "samplers": ["top_k"], "stream": True}  # fmt: skip

    def request(kind: str, typed: str, extra: list[dict[str, str]], back: int = 0) -> Request:
        """The cursor after `typed` on the line being typed, or `back` lines above it."""
        if back:
            prefix, line = "".join(before[:-back]), ""
            suffix = "".join(before[-back:]) + typed + "\n" + "".join(after)
        else:
            prefix, line, suffix = "".join(before), typed, "\n" + "".join(after)
        return Request(kind, {"input_prefix": prefix, "prompt": line, "input_suffix": suffix,
                              "input_extra": extra, **fixed})  # fmt: skip

    out = [Request("warm", {**fixed, "n_predict": 0, "input_prefix": "", "input_suffix": "",
                            "input_extra": chunks[:sent]})]  # fmt: skip
    typed = ""
    pos = 0  # characters of `target` typed
    back_at = args.keystrokes // 2
    key = 0
    while key < args.keystrokes:
        if key in arrivals:
            sent = arrivals[key]
            out.append(Request("warm", {**fixed, "n_predict": 0, "input_prefix": "",
                                        "input_suffix": "", "input_extra": chunks[:sent]}))  # fmt: skip
        extra = chunks[:sent]
        if key == back_at:  # the cursor goes up five lines and comes back
            out.append(request("back", typed, extra, back=5))
            key += 1
            continue
        if key % 17 == 16 and len(typed) >= 3:  # three backspaces, retyped after
            typed = typed[:-1]
            pos -= 1
            out.append(request("key", typed, extra))
            key += 1
            continue
        if pos >= len(target):  # the line is done: a new one, typed again
            typed, pos = "", 0
            before = [*before, target + "\n"]
        typed += target[pos]
        pos += 1
        out.append(request("key", typed, extra))
        key += 1
    return out


# ---- the client ----------------------------------------------------------------------


class Client:
    """One connection per request: llama-server closes a streamed response's connection
    (a loopback connect costs both servers the same fraction of a millisecond)."""

    def __init__(self, url: str, timeout: float) -> None:
        u = urllib.parse.urlsplit(url)
        self.host, self.port = u.hostname or "127.0.0.1", u.port or 80
        self.timeout = timeout

    def infill(self, body: dict[str, Any]) -> tuple[dict[str, Any], float, float]:
        """(final object, time to first text, total time)."""
        conn = http.client.HTTPConnection(self.host, self.port, timeout=self.timeout)
        data = json.dumps(body).encode()
        try:
            t0 = time.perf_counter()
            conn.request("POST", "/infill", data, {"Content-Type": "application/json"})
            return self._read(conn.getresponse(), t0)
        finally:
            conn.close()

    def _read(self, resp: http.client.HTTPResponse, t0: float
              ) -> tuple[dict[str, Any], float, float]:  # fmt: skip
        if resp.status != 200:
            raise CliError(f"{self.host}:{self.port}: /infill {resp.status}: {resp.read()[:300]!r}")
        ttft: float | None = None
        final: dict[str, Any] = {}
        for raw in resp:
            line = raw.decode().strip()
            if not line.startswith("data: "):
                continue
            obj = json.loads(line[6:])
            if ttft is None and obj.get("content"):
                ttft = time.perf_counter() - t0
            if obj.get("stop"):
                final = obj
        total = time.perf_counter() - t0
        return final, ttft if ttft is not None else total, total


def percentile(values: list[float], q: float) -> float:
    if not values:
        return math.nan
    s = sorted(values)
    return s[min(len(s) - 1, max(0, math.ceil(q * len(s)) - 1))]


def measure(label: str, client: Client, req: Request, rnd: int, i: int) -> dict[str, Any]:
    final, ttft, total = client.infill(req.body)
    prompt = int(final.get("tokens_evaluated", 0))
    reused = int(final.get("timings", {}).get("cache_n", 0))  # prompt tokens reused
    row = {
        "label": label, "round": rnd, "index": i, "kind": req.kind,
        "prompt_tokens": prompt, "reused_tokens": reused,
        "evaluated_tokens": int(final.get("timings", {}).get("prompt_n", prompt - reused)),
        "predicted_tokens": int(final.get("tokens_predicted", 0)),
        "ttft_s": round(ttft, 6), "total_s": round(total, 6),
    }  # fmt: skip
    # as it goes: a long replay shows its progress, and a stopped one what it measured
    print(f"{label} r{rnd} #{i} {req.kind}: prompt {prompt}, reused {reused}, evaluated "
          f"{row['evaluated_tokens']}, ttft {1000 * ttft:.0f} ms, total {1000 * total:.0f} ms",
          flush=True)  # fmt: skip
    return row


def replay_round(servers: list[tuple[str, str]], requests: list[Request], rnd: int,
                 args: argparse.Namespace) -> list[dict[str, Any]]:  # fmt: skip
    """One round on every server; rows in the order they were measured."""
    clients = [(label, Client(url, args.timeout)) for label, url in servers]
    rows: list[dict[str, Any]] = []
    if args.interleave == "server":
        order = clients if rnd % 2 == 0 else clients[::-1]
        for label, client in order:
            mine = [measure(label, client, req, rnd, i) for i, req in enumerate(requests)]
            rows += mine
            if args.csv:  # each server's rows once its replay is over
                write_csv(args.csv, mine)
        return rows
    for i, req in enumerate(requests):
        k = (i + rnd) % len(clients)  # who goes first rotates
        step = [measure(label, client, req, rnd, i) for label, client in clients[k:] + clients[:k]]
        rows += step
        if args.csv:  # as it goes: a stopped replay keeps what it measured
            write_csv(args.csv, step)
    return rows


def write_plot(path: Path, rows: list[dict[str, Any]]) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(12, 4.5))
    for label in dict.fromkeys(r["label"] for r in rows):
        mine = [r for r in rows if r["label"] == label and r["round"] == 0]
        ax.plot([r["index"] for r in mine], [1000 * float(r["ttft_s"]) for r in mine],
                ".-", label=label, linewidth=0.8)  # fmt: skip
    ax.set_xlabel("request (keystrokes, warm-ups, the cursor's jump)")
    ax.set_ylabel("time to first token (ms)")
    ax.set_yscale("log")
    ax.legend()
    ax.set_title("ds4d bench infill: an editing session replayed (round 0)")
    fig.tight_layout()
    fig.savefig(path, dpi=120)


def write_csv(path: Path, rows: list[dict[str, Any]]) -> None:
    new = not path.exists()
    with path.open("a", newline="") as f:
        w = csv.DictWriter(f, fieldnames=CSV_FIELDS)
        if new:
            w.writeheader()
        w.writerows(rows)


def run(args: argparse.Namespace) -> int:
    servers = []
    for s in args.server:
        label, sep, url = s.partition("=")
        if not sep:
            raise CliError(f"--server takes LABEL=URL, got {s!r}", 2)
        servers.append((label, url))
    if args.plot and importlib.util.find_spec("matplotlib") is None:
        raise CliError("--plot needs matplotlib: pip install 'ds4d[plot]'", 2)
    rows: list[dict[str, Any]] = []
    for rnd in range(args.rounds):
        rows += replay_round(servers, session(args, f"round {rnd}"), rnd, args)
    print(f"{'label':<24} {'round':>5} {'req':>4} {'prompt':>7} {'reused':>7} {'eval':>6} "
          f"{'ttft_p50':>9} {'ttft_p95':>9} {'total_p50':>9}")  # fmt: skip
    for label, _ in servers:
        for rnd in range(args.rounds):
            mine = [r for r in rows if r["label"] == label and r["round"] == rnd]
            keys = [r for r in mine if r["kind"] != "warm"]
            ttft = [r["ttft_s"] for r in keys]
            print(f"{label:<24} {rnd:>5} {len(mine):>4} "
                  f"{sum(r['prompt_tokens'] for r in mine):>7} "
                  f"{sum(r['reused_tokens'] for r in mine):>7} "
                  f"{sum(r['evaluated_tokens'] for r in mine):>6} "
                  f"{1000 * percentile(ttft, 0.5):>7.1f}ms {1000 * percentile(ttft, 0.95):>7.1f}ms "
                  f"{1000 * percentile([r['total_s'] for r in keys], 0.5):>7.1f}ms")  # fmt: skip
    if args.plot:
        write_plot(args.plot, rows)
    return 0
