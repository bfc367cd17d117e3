"""`ds4d bench serve`: a serving benchmark. K concurrent clients each replay a growing
multi-turn conversation against a running server and the run reports aggregate generated
tokens/s, time to first token p50/p95 and inter-token latency p95 (p99 and the longest
gap in the CSV), for each K.

The workload is a function of the seed and the text file alone, so the same command run
against ds4d and against another OpenAI-compatible server (llama.cpp's `llama-server`)
sends the same requests: each conversation opens with a passage of the text (the first
conversation with a long one), every later turn carries the previous turns plus a
scripted assistant reply and a new passage, so each prompt extends the last and a server
that keeps prompt prefixes prefills only the new part. Turns are streamed or not
(the first one of each conversation always is, so every conversation yields a time to
first token). Sampling is greedy and answers are capped at --max-tokens.

The client is deliberately plain (http.client, one thread and one keep-alive connection
per conversation): it is the yardstick's ruler, not part of the daemon.
"""

from __future__ import annotations

import argparse
import csv
import http.client
import importlib.util
import json
import math
import random
import sys
import threading
import time
import urllib.parse
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ds4d.daemon.exitcodes import CliError
from ds4d.tools.serve_process import ServeProcessError, private_daemon

CSV_FIELDS = (
    "label",
    "api",
    "clients",
    "requests",
    "streamed",
    "errors",
    "wall_s",
    "prompt_tokens",
    "cached_tokens",
    "completion_tokens",
    "server_completion_tokens",
    "gen_tps",
    "ttft_p50_s",
    "ttft_p95_s",
    "itl_p50_s",
    "itl_p95_s",
    "latency_p95_s",
    "itl_p99_s",
    "itl_max_s",
)

# The counter of generated tokens in each server's /metrics, to check the usage the
# answers report against the server's own count (llama-server exposes it with --metrics).
SERVER_GENERATED_COUNTERS = ("ds4d_generated_tokens_total", "llamacpp:tokens_predicted_total")

START_TIMEOUT_S = 300.0
WORKLOAD_SALT = "ds4d-bench-serve"


def _default_text() -> Path:
    checkout = Path(__file__).resolve().parents[2]  # ds4d/tools/bench_serve.py
    return checkout / "tests" / "data" / "text" / "promessi_sposi.txt"


def add_arguments(p: argparse.ArgumentParser) -> None:
    target = p.add_mutually_exclusive_group(required=True)
    target.add_argument("--url", help="base URL of a running server, e.g. http://127.0.0.1:8000")
    target.add_argument(
        "--start",
        action="store_true",
        help="start a ds4d daemon for the run (with the ds4d flags given after `--`), on a "
        "free port with private, temporary cache and state directories",
    )
    p.add_argument("--serve-python", metavar="PYTHON",
                   help="with --start: the interpreter that runs `ds4d serve` (default: this "
                   "one); another checkout's venv python serves that checkout's daemon to "
                   "this client, to compare two trees with one workload")  # fmt: skip
    p.add_argument(
        "--api",
        choices=("openai", "anthropic"),
        default="openai",
        help="openai: POST /v1/chat/completions (ds4d, llama-server); anthropic: POST "
        "/v1/messages (default: openai)",
    )
    p.add_argument("--label", help="name of this series in the CSV and the plot "
                   "(default: ds4d with --start, else the URL's host:port)")  # fmt: skip
    p.add_argument("--model", default="local", help="model name sent in requests")
    p.add_argument("--api-key", help="sent as Authorization: Bearer and x-api-key")
    p.add_argument("--clients", default="1,2,4",
                   help="comma-separated numbers K of concurrent clients, one run each")  # fmt: skip
    p.add_argument("--turns", type=int, default=4, help="turns of each conversation")
    p.add_argument("--max-tokens", type=int, default=64, help="answer cap of every request")
    p.add_argument("--first-words", type=int, default=150,
                   help="mean words of a conversation's first passage")  # fmt: skip
    p.add_argument("--long-words", type=int, default=1000,
                   help="words of the first conversation's first passage (the long prompt)")  # fmt: skip
    p.add_argument("--turn-words", type=int, default=60,
                   help="mean words of each later turn's passage")  # fmt: skip
    p.add_argument("--reply-words", type=int, default=30,
                   help="mean words of the scripted assistant reply kept in the history")  # fmt: skip
    p.add_argument(
        "--replies",
        choices=("scripted", "generated"),
        default="scripted",
        help="what the history carries as each earlier answer: a scripted passage (every "
        "request a function of the seed, whatever the server answers) or the answer the "
        "server gave, as an agent sends it back (default: scripted)",
    )
    p.add_argument("--stream-share", type=float, default=0.7,
                   help="share of turns after the first that are streamed")  # fmt: skip
    p.add_argument("--seed", type=int, default=1, help="seed of the workload")
    p.add_argument("--text", type=Path, default=None,
                   help="text the passages are taken from (default: the checkout's "
                   "tests/data/text/promessi_sposi.txt)")  # fmt: skip
    p.add_argument("--timeout", type=float, default=600.0, help="seconds allowed per request")
    p.add_argument("--csv", type=Path,
                   help="CSV to write; rows of other labels already in it are kept")  # fmt: skip
    p.add_argument("--plot", type=Path, help="PNG of every series in the CSV (needs matplotlib)")
    p.add_argument("--requests-log", type=Path, help="JSON lines, one per request")
    p.add_argument("serve_args", nargs="*", metavar="-- DS4D_FLAGS",
                   help="with --start: flags for `ds4d serve`, after `--`")  # fmt: skip


# --- the workload ---------------------------------------------------------------------


@dataclass(frozen=True)
class Shape:
    turns: int
    max_tokens: int
    first_words: int
    long_words: int
    turn_words: int
    reply_words: int
    stream_share: float


@dataclass(frozen=True)
class Turn:
    user: str
    reply: str  # the assistant message the history carries after this turn
    stream: bool


@dataclass(frozen=True)
class Conversation:
    index: int
    system: str
    turns: tuple[Turn, ...]


def _around(rng: random.Random, mean: int) -> int:
    return max(1, rng.randint(mean - mean // 2, mean + mean // 2))


def _passage(words: Sequence[str], rng: random.Random, n: int) -> str:
    start = rng.randrange(len(words))
    return " ".join(words[(start + k) % len(words)] for k in range(n))


def build_workload(
    words: Sequence[str], seed: int, clients: int, shape: Shape
) -> list[Conversation]:
    """The conversations of a run with `clients` clients. Conversation i has the same
    lengths and streaming pattern at every K (drawn from the seed and i), and text drawn
    from the seed, i and K: a run at one K does not find the prompts of another already
    cached."""
    if not words:
        raise ValueError("the text has no words")
    out = []
    for i in range(clients):
        lengths = random.Random(f"{WORKLOAD_SALT}:{seed}:{i}")
        text = random.Random(f"{WORKLOAD_SALT}:{seed}:{clients}:{i}")
        turns = []
        for t in range(shape.turns):
            if t == 0:
                n = shape.long_words if i == 0 else _around(lengths, shape.first_words)
                user = (f"Read this passage.\n\n{_passage(words, text, n)}\n\n"
                        "Summarize it in a few sentences.")  # fmt: skip
            else:
                n = _around(lengths, shape.turn_words)
                user = (f"Here is how it goes on.\n\n{_passage(words, text, n)}\n\n"
                        "What changes for the characters?")  # fmt: skip
            reply = _passage(words, text, _around(lengths, shape.reply_words))
            stream = t == 0 or lengths.random() < shape.stream_share
            turns.append(Turn(user, reply, stream))
        system = f"Session {seed}-{clients}-{i}. You are a careful reader of Italian novels."
        out.append(Conversation(i, system, tuple(turns)))
    return out


def chat_messages(conv: Conversation, turn: int, replies: Sequence[str]) -> list[dict[str, str]]:
    """The history sent at `turn`: every earlier turn with its reply (`replies[t]`), then
    the turn's own user message (the system prompt is separate: Anthropic takes it apart)."""
    messages = []
    for t, reply in zip(conv.turns[:turn], replies, strict=True):
        messages += [{"role": "user", "content": t.user}, {"role": "assistant", "content": reply}]
    messages.append({"role": "user", "content": conv.turns[turn].user})
    return messages


# --- one request ----------------------------------------------------------------------


@dataclass
class Result:
    conversation: int
    turn: int
    stream: bool
    start_s: float = 0.0  # since the run began
    latency_s: float = 0.0
    ttft_s: float | None = None  # streams only: until the first generated text
    gaps_s: list[float] = field(default_factory=list)  # between generated-text events
    prompt_tokens: int = 0
    cached_tokens: int | None = None
    completion_tokens: int = 0
    chunks: int = 0  # streamed events that carried generated text
    text: str = ""
    error: str = ""


@dataclass(frozen=True)
class Target:
    url: str
    api: str
    model: str
    api_key: str | None
    timeout: float
    max_tokens: int

    @property
    def path(self) -> str:
        return "/v1/messages" if self.api == "anthropic" else "/v1/chat/completions"

    def headers(self) -> dict[str, str]:
        h = {"content-type": "application/json"}
        if self.api_key:
            h["authorization"] = f"Bearer {self.api_key}"
            h["x-api-key"] = self.api_key
        if self.api == "anthropic":
            h["anthropic-version"] = "2023-06-01"
        return h

    def body(self, conv: Conversation, turn: int, replies: Sequence[str]) -> dict[str, Any]:
        stream = conv.turns[turn].stream
        messages = chat_messages(conv, turn, replies)
        body: dict[str, Any] = {
            "model": self.model,
            "max_tokens": self.max_tokens,
            "temperature": 0,
            "stream": stream,
        }
        if self.api == "anthropic":
            body.update(system=conv.system, messages=messages)
        else:
            body["messages"] = [{"role": "system", "content": conv.system}, *messages]
            if stream:
                body["stream_options"] = {"include_usage": True}
        return body

    def connect(self) -> http.client.HTTPConnection:
        u = urllib.parse.urlsplit(self.url)
        cls = http.client.HTTPSConnection if u.scheme == "https" else http.client.HTTPConnection
        return cls(u.hostname or "127.0.0.1", u.port, timeout=self.timeout)


def _usage_openai(obj: dict[str, Any], r: Result) -> None:
    usage = obj.get("usage")
    if isinstance(usage, dict):
        r.prompt_tokens = int(usage.get("prompt_tokens") or 0)
        r.completion_tokens = int(usage.get("completion_tokens") or 0)
        details = usage.get("prompt_tokens_details")
        if isinstance(details, dict) and details.get("cached_tokens") is not None:
            r.cached_tokens = int(details["cached_tokens"])
    timings = obj.get("timings")  # llama-server's own report of the reused prompt
    if r.cached_tokens is None and isinstance(timings, dict) and "cache_n" in timings:
        r.cached_tokens = int(timings["cache_n"])


def _usage_anthropic(usage: Any, r: Result) -> None:
    if not isinstance(usage, dict):
        return
    read = usage.get("cache_read_input_tokens")
    if "input_tokens" in usage:
        created = int(usage.get("cache_creation_input_tokens") or 0)
        r.prompt_tokens = int(usage["input_tokens"] or 0) + int(read or 0) + created
        if read is not None:
            r.cached_tokens = int(read)
    if "output_tokens" in usage:
        r.completion_tokens = int(usage["output_tokens"] or 0)


def _delta_text(api: str, obj: dict[str, Any]) -> str:
    """The generated text an event carries (content, reasoning or tool-call arguments)."""
    if api == "anthropic":
        if obj.get("type") != "content_block_delta":
            return ""
        d = obj.get("delta") or {}
        return str(d.get("text") or d.get("thinking") or d.get("partial_json") or "")
    out = ""
    for choice in obj.get("choices") or ():
        d = choice.get("delta") or {}
        out += str(d.get("content") or "") + str(d.get("reasoning_content") or "")
        for call in d.get("tool_calls") or ():
            fn = call.get("function") or {}
            out += str(fn.get("name") or "") + str(fn.get("arguments") or "")
    return out


def _sse_events(resp: http.client.HTTPResponse) -> Iterator[dict[str, Any]]:
    """The JSON of each `data:` line; a stream's terminating `[DONE]` ends it."""
    for raw in resp:
        line = raw.decode("utf-8", errors="replace").strip()
        if not line.startswith("data:"):
            continue  # `event:` names, `:` keepalive comments, blank separators
        data = line[5:].strip()
        if data == "[DONE]":
            return
        obj = json.loads(data)
        if isinstance(obj, dict):
            yield obj


def run_request(
    target: Target,
    conn: http.client.HTTPConnection,
    conv: Conversation,
    turn: int,
    replies: Sequence[str],
    t0: float,
) -> Result:
    r = Result(conv.index, turn, conv.turns[turn].stream)
    body = json.dumps(target.body(conv, turn, replies)).encode()
    sent = time.perf_counter()
    r.start_s = sent - t0
    try:
        try:
            conn.request("POST", target.path, body=body, headers=target.headers())
            resp = conn.getresponse()
        except (http.client.RemoteDisconnected, BrokenPipeError, ConnectionResetError):
            # the server closed the kept-alive connection between requests (llama-server
            # does after a stream): the request was not served, so send it again afresh
            conn.close()
            sent = time.perf_counter()
            r.start_s = sent - t0
            conn.request("POST", target.path, body=body, headers=target.headers())
            resp = conn.getresponse()
        if resp.status != 200:
            r.error = f"HTTP {resp.status}: {resp.read()[:300].decode(errors='replace')}"
            return r
        if r.stream:
            last = None
            for obj in _sse_events(resp):
                piece = _delta_text(target.api, obj)
                if piece:
                    now = time.perf_counter()
                    if last is None:
                        r.ttft_s = now - sent
                    else:
                        r.gaps_s.append(now - last)
                    last = now
                    r.chunks += 1
                    r.text += piece
                if target.api == "anthropic":
                    _usage_anthropic((obj.get("message") or {}).get("usage"), r)
                    _usage_anthropic(obj.get("usage"), r)
                else:
                    _usage_openai(obj, r)
                if obj.get("type") == "error" or (target.api == "openai" and "error" in obj):
                    r.error = f"error event: {json.dumps(obj)[:300]}"
            resp.read()  # the rest, so the connection can carry the next request
        else:
            obj = json.loads(resp.read())
            if target.api == "anthropic":
                _usage_anthropic(obj.get("usage"), r)
                r.text = "".join(
                    b.get("text", "") for b in obj.get("content") or () if isinstance(b, dict)
                )
            else:
                _usage_openai(obj, r)
                msg = ((obj.get("choices") or [{}])[0]).get("message") or {}
                r.text = str(msg.get("content") or "")
    except Exception as e:  # any failure (transport, a malformed answer) is this request's
        r.error = f"{type(e).__name__}: {e}"
        conn.close()  # reconnects on the next request
    finally:
        r.latency_s = time.perf_counter() - sent
    return r


# --- one run at K clients -------------------------------------------------------------


@dataclass
class Row:
    label: str
    api: str
    clients: int
    requests: int
    streamed: int
    errors: int
    wall_s: float
    prompt_tokens: int
    cached_tokens: int | None
    completion_tokens: int
    server_completion_tokens: int | None
    gen_tps: float
    ttft_p50_s: float | None
    ttft_p95_s: float | None
    itl_p50_s: float | None
    itl_p95_s: float | None
    latency_p95_s: float | None
    itl_p99_s: float | None = None
    itl_max_s: float | None = None


def percentile(values: Sequence[float], q: float) -> float | None:
    """Linear interpolation between closest ranks; None for no values."""
    if not values:
        return None
    s = sorted(values)
    pos = (len(s) - 1) * q / 100
    lo = math.floor(pos)
    hi = min(lo + 1, len(s) - 1)
    return s[lo] + (s[hi] - s[lo]) * (pos - lo)


def run_clients(
    target: Target, conversations: list[Conversation], generated_replies: bool = False
) -> tuple[list[Result], float]:
    """Every conversation on its own thread, all released at once; each sends its turns
    back to back. The history carries the scripted replies, or with `generated_replies`
    the answers the server gave (as an agent does; a failed turn keeps its scripted one).
    Returns the results and the wall time from release to the last answer."""
    results: list[Result] = []
    lock = threading.Lock()
    gate = threading.Barrier(len(conversations) + 1)
    t0_box: list[float] = []

    def client(conv: Conversation) -> None:
        conn = target.connect()
        try:
            gate.wait()
            t0 = t0_box[0]
            replies: list[str] = []
            for turn in range(len(conv.turns)):
                r = run_request(target, conn, conv, turn, replies, t0)
                with lock:
                    results.append(r)
                keep = generated_replies and not r.error
                replies.append(r.text if keep else conv.turns[turn].reply)
        finally:
            conn.close()

    threads = [threading.Thread(target=client, args=(c,), daemon=True) for c in conversations]
    for th in threads:
        th.start()
    t0_box.append(time.perf_counter())
    gate.wait()
    for th in threads:
        th.join()
    wall = time.perf_counter() - t0_box[0]
    results.sort(key=lambda r: (r.conversation, r.turn))
    return results, wall


def summarize(label: str, api: str, clients: int, results: list[Result], wall: float,
              server_tokens: int | None) -> Row:  # fmt: skip
    ok = [r for r in results if not r.error]
    ttfts = [r.ttft_s for r in ok if r.ttft_s is not None]
    gaps = [g for r in ok for g in r.gaps_s]
    cached = [r.cached_tokens for r in ok if r.cached_tokens is not None]
    completion = sum(r.completion_tokens for r in ok)
    return Row(
        label=label,
        api=api,
        clients=clients,
        requests=len(results),
        streamed=sum(r.stream for r in results),
        errors=len(results) - len(ok),
        wall_s=wall,
        prompt_tokens=sum(r.prompt_tokens for r in ok),
        cached_tokens=sum(cached) if len(cached) == len(ok) else None,
        completion_tokens=completion,
        server_completion_tokens=server_tokens,
        gen_tps=completion / wall if wall > 0 else 0.0,
        ttft_p50_s=percentile(ttfts, 50),
        ttft_p95_s=percentile(ttfts, 95),
        itl_p50_s=percentile(gaps, 50),
        itl_p95_s=percentile(gaps, 95),
        latency_p95_s=percentile([r.latency_s for r in ok], 95),
        itl_p99_s=percentile(gaps, 99),
        itl_max_s=max(gaps) if gaps else None,
    )


# --- the server's own count -----------------------------------------------------------


def server_generated(target: Target) -> int | None:
    """The server's generated-token counter from /metrics, None if it exposes none."""
    conn = target.connect()
    try:
        conn.request("GET", "/metrics", headers=target.headers())
        resp = conn.getresponse()
        text = resp.read().decode(errors="replace")
        if resp.status != 200:
            return None
    except (OSError, http.client.HTTPException):
        return None
    finally:
        conn.close()
    for line in text.splitlines():
        name, _, value = line.rpartition(" ")
        if name in SERVER_GENERATED_COUNTERS:
            try:
                return int(float(value))
            except ValueError:
                return None
    return None


def server_delta(target: Target, before: int | None, expected: int) -> int | None:
    """The counter's growth over a run. A server may account a request just after its
    answer is sent, so a short wait lets the last ones land before the count is taken."""
    if before is None:
        return None
    deadline = time.monotonic() + 3.0
    while True:
        after = server_generated(target)
        if after is None:
            return None
        if after - before >= expected or time.monotonic() > deadline:
            return after - before
        time.sleep(0.1)  # poll: the server's accounting offers nothing to wait on


# --- starting a daemon ----------------------------------------------------------------


@contextmanager
def started_daemon(serve_args: list[str], python: str | None = None) -> Iterator[str]:
    """A private `ds4d serve` of this interpreter or `python` (ds4d.tools.serve_process),
    its output echoed; yields its base URL."""
    try:
        with private_daemon(serve_args, start_timeout=START_TIMEOUT_S, echo=True,
                            python=python) as url:  # fmt: skip
            yield url
    except ServeProcessError as e:
        raise CliError(str(e)) from None


# --- output ---------------------------------------------------------------------------


def _fmt(v: object) -> str:
    if v is None:
        return ""
    if isinstance(v, float):
        return f"{v:.4f}"
    return str(v)


def write_csv(path: Path, rows: list[Row]) -> list[dict[str, str]]:
    """Writes `rows` after the rows of other labels already in the file (same columns);
    returns every row written, as text."""
    labels = {r.label for r in rows}
    kept: list[dict[str, str]] = []
    if path.exists():
        with path.open(newline="") as f:
            reader = csv.DictReader(f)
            if tuple(reader.fieldnames or ()) != CSV_FIELDS:
                raise CliError(f"{path} has other columns than `ds4d bench serve` writes")
            kept = [r for r in reader if r["label"] not in labels]
    new = [{k: _fmt(getattr(r, k)) for k in CSV_FIELDS} for r in rows]
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=CSV_FIELDS)
        w.writeheader()
        w.writerows(kept + new)
    return kept + new


def write_plot(path: Path, rows: list[dict[str, str]]) -> None:
    import matplotlib

    matplotlib.use("Agg")  # files only: no display needed
    import matplotlib.pyplot as plt

    series: dict[str, list[dict[str, str]]] = {}
    for r in rows:
        series.setdefault(r["label"], []).append(r)
    panels = (
        ("aggregate generated tokens/s", [("gen_tps", "", 1.0)]),
        ("time to first token (s)", [("ttft_p50_s", " p50", 1.0), ("ttft_p95_s", " p95", 1.0)]),
        ("inter-token latency p95 (ms)", [("itl_p95_s", "", 1000.0)]),
    )
    ks = sorted({int(r["clients"]) for r in rows})
    colors = plt.rcParams["axes.prop_cycle"].by_key()["color"]
    fig, axes = plt.subplots(1, 3, figsize=(14, 4.2))
    for ax, (title, columns) in zip(axes, panels, strict=True):
        for n, (label, rs) in enumerate(series.items()):
            rs = sorted(rs, key=lambda r: int(r["clients"]))
            for col, suffix, scale in columns:
                pts = [(int(r["clients"]), float(r[col]) * scale) for r in rs if r[col]]
                if pts:
                    ax.plot(*zip(*pts, strict=True), "--" if suffix == " p95" else "-",
                            color=colors[n % len(colors)], marker="o", label=label + suffix)  # fmt: skip
        ax.set_title(title)
        ax.set_xlabel("concurrent clients K")
        ax.set_xticks(ks)
        ax.set_ylim(bottom=0)
        ax.grid(True, alpha=0.3)
        ax.legend(fontsize=8)
    fig.suptitle("ds4d bench serve")
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def _print_row(row: Row) -> None:
    def s(v: float | None, scale: float = 1.0, width: int = 8, digits: int = 2) -> str:
        return f"{v * scale:>{width}.{digits}f}" if v is not None else f"{'-':>{width}}"

    print(f"{row.label[:16]:<16} {row.clients:>3} {row.requests:>5} {row.errors:>4} "
          f"{row.completion_tokens:>7} {row.wall_s:>8.2f} {row.gen_tps:>8.2f} "
          f"{s(row.ttft_p50_s)} {s(row.ttft_p95_s)} {s(row.itl_p95_s, 1000, 8, 1)} "
          f"{s(row.itl_p99_s, 1000, 8, 1)}", flush=True)  # fmt: skip


# --- the command ----------------------------------------------------------------------


def _clients(spec: str) -> list[int]:
    try:
        ks = [int(x) for x in spec.split(",") if x.strip()]
    except ValueError:
        ks = []
    if not ks or min(ks) < 1:
        raise CliError("--clients must be a comma-separated list of numbers ≥ 1", 2)
    return ks


def _words(path: Path | None) -> list[str]:
    path = path or _default_text()
    try:
        words = path.read_text(encoding="utf-8", errors="replace").split()
    except OSError as e:
        hint = "" if path != _default_text() else " (outside a checkout, pass --text FILE)"
        raise CliError(f"cannot read --text {path}: {e.strerror}{hint}") from None
    if not words:
        raise CliError(f"--text {path} has no words")
    return words


def run(args: argparse.Namespace) -> int:
    ks = _clients(args.clients)
    if args.turns < 1 or args.max_tokens < 1 or args.timeout <= 0:
        raise CliError("--turns and --max-tokens must be ≥ 1, --timeout > 0", 2)
    if min(args.first_words, args.long_words, args.turn_words, args.reply_words) < 1:
        raise CliError("the --*-words lengths must be ≥ 1", 2)
    if not 0 <= args.stream_share <= 1:
        raise CliError("--stream-share must be within 0..1", 2)
    if args.serve_args and not args.start:
        raise CliError("flags after `--` are for `ds4d serve` and need --start", 2)
    if args.serve_python and not args.start:
        raise CliError("--serve-python needs --start", 2)
    if args.plot and importlib.util.find_spec("matplotlib") is None:
        raise CliError("--plot needs matplotlib: pip install 'ds4d[plot]'", 2)
    words = _words(args.text)
    shape = Shape(args.turns, args.max_tokens, args.first_words, args.long_words,
                  args.turn_words, args.reply_words, args.stream_share)  # fmt: skip
    if args.start:
        with started_daemon(list(args.serve_args), args.serve_python) as url:
            return _bench(args, url, args.label or "ds4d", ks, words, shape)
    url = args.url.rstrip("/")
    if not url.startswith(("http://", "https://")):
        raise CliError("--url must start with http:// or https://", 2)
    label = args.label or (urllib.parse.urlsplit(url).netloc or url)
    return _bench(args, url, label, ks, words, shape)


def _bench(args: argparse.Namespace, url: str, label: str, ks: list[int], words: list[str],
           shape: Shape) -> int:  # fmt: skip
    target = Target(url, args.api, args.model, args.api_key, args.timeout, args.max_tokens)
    warm_up = Conversation(-1, "Warm-up.", (Turn("Say hi.", "", False),))
    warm = run_request(target, target.connect(), warm_up, 0, [], time.perf_counter())
    if warm.error:
        raise CliError(f"{url}{target.path}: {warm.error}")
    print(f"# {label}: {url} ({args.api}), seed {args.seed}, {shape.turns} turns, "
          f"max_tokens {shape.max_tokens}, long prompt {shape.long_words} words, "
          f"{args.replies} replies", flush=True)  # fmt: skip
    print(f"{'label':<16} {'K':>3} {'reqs':>5} {'errs':>4} {'gen tok':>7} {'wall s':>8} "
          f"{'gen t/s':>8} {'ttft p50':>8} {'ttft p95':>8} {'itl p95':>8} {'itl p99':>8}",
          flush=True)  # fmt: skip
    rows = []
    log = None
    if args.requests_log:
        try:
            args.requests_log.parent.mkdir(parents=True, exist_ok=True)
            log = args.requests_log.open("a")  # appended: one log may hold several labels
        except OSError as e:
            raise CliError(
                f"cannot write --requests-log {args.requests_log}: {e.strerror}"
            ) from None
    try:
        for k in ks:
            conversations = build_workload(words, args.seed, k, shape)
            before = server_generated(target)
            results, wall = run_clients(target, conversations, args.replies == "generated")
            completion = sum(r.completion_tokens for r in results if not r.error)
            row = summarize(label, args.api, k, results, wall,
                            server_delta(target, before, completion))  # fmt: skip
            rows.append(row)
            _print_row(row)
            if log is not None:
                for r in results:
                    rec = {"label": label, "clients": k, **r.__dict__}
                    log.write(json.dumps(rec, ensure_ascii=False) + "\n")
                log.flush()
            for r in results:
                if r.error:
                    print(f"# K={k} conversation {r.conversation} turn {r.turn}: {r.error}",
                          file=sys.stderr)  # fmt: skip
    finally:
        if log is not None:
            log.close()
    all_rows = write_csv(args.csv, rows) if args.csv else None
    if args.plot:
        if all_rows is None:
            all_rows = [{k: _fmt(getattr(r, k)) for k in CSV_FIELDS} for r in rows]
        write_plot(args.plot, all_rows)
    return 1 if any(r.errors for r in rows) else 0
