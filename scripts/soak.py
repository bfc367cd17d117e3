"""Soak figures: concurrent clients against one real ds4d process for a while.

Each client thread holds its own conversation and loops until the time is up: it picks one
of the four APIs (OpenAI chat completions, completions, responses, Anthropic messages)
and streaming or not in turn, sends the conversation so far plus a new user turn, appends
the reply, and starts a new conversation once the prompt passes --reset-tokens (so the
KV cache sees growing conversations, prefix reuse, evictions and disk checkpoints).

Printed at the end: requests and errors per API, the daemon's RSS after the warm-up and
at the end (and its peak), the growth between the two, and the error texts seen.

Usage (the embedded SmolLM2 model unless --model):
    .venv/bin/python scripts/soak.py --minutes 30 --clients 3
A measuring tool, not a test: every request loop is bounded by the deadline and by a
per-request timeout; traffic goes to 127.0.0.1 only.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import threading
import time
from collections import Counter
from contextlib import ExitStack
from dataclasses import dataclass, field
from pathlib import Path

import httpx

from ds4d.serve_process import ServeProcessError, private_env, serve_process

TOPICS = [
    "rivers", "bread", "compilers", "the moon", "chess", "gardens", "trains", "music",
    "volcanoes", "bees", "lighthouses", "maps", "glass", "clocks", "the sea", "paper",
]  # fmt: skip
APIS = ("chat", "completions", "responses", "anthropic")


def rss_kib(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1])
    return 0


@dataclass
class Tally:
    lock: threading.Lock = field(default_factory=threading.Lock)
    requests: Counter = field(default_factory=Counter)
    errors: Counter = field(default_factory=Counter)
    error_texts: Counter = field(default_factory=Counter)
    tokens_out: int = 0

    def ok(self, api: str, n_out: int) -> None:
        with self.lock:
            self.requests[api] += 1
            self.tokens_out += n_out

    def fail(self, api: str, text: str) -> None:
        with self.lock:
            self.requests[api] += 1
            self.errors[api] += 1
            self.error_texts[text[:200]] += 1


def sse_events(resp: httpx.Response) -> list[dict]:
    """The JSON data of every SSE event of a streamed response, in order."""
    out = []
    for line in resp.iter_lines():
        if line.startswith("data:"):
            data = line[5:].strip()
            if data and data != "[DONE]":
                out.append(json.loads(data))
    return out


def one_request(
    http: httpx.Client, api: str, stream: bool, turns: list[tuple[str, str]], max_tokens: int
) -> tuple[str, int]:
    """Sends the conversation (user, assistant)* + the last user turn; returns the reply
    text and the completion tokens. Raises RuntimeError on any protocol-level error."""
    msgs: list[dict] = []
    for user, assistant in turns[:-1]:
        msgs += [{"role": "user", "content": user}, {"role": "assistant", "content": assistant}]
    msgs.append({"role": "user", "content": turns[-1][0]})
    common = {"model": "ds4d", "max_tokens": max_tokens, "temperature": 0.7, "stream": stream}
    if api == "chat":
        path, body = "/v1/chat/completions", {**common, "messages": msgs}
        if stream:
            body["stream_options"] = {"include_usage": True}
    elif api == "completions":
        prompt = "".join(f"Q: {m['content']}\nA: " if m["role"] == "user" else m["content"] + "\n"
                         for m in msgs)  # fmt: skip
        path, body = "/v1/completions", {**common, "prompt": prompt}
        if stream:
            body["stream_options"] = {"include_usage": True}
    elif api == "responses":
        body = {k: v for k, v in common.items() if k != "max_tokens"}
        path, body = "/v1/responses", {**body, "input": msgs, "max_output_tokens": max_tokens}
    else:
        path, body = "/v1/messages", {**common, "messages": msgs}
    if not stream:
        r = http.post(path, json=body)
        if r.status_code != 200:
            raise RuntimeError(f"{api} HTTP {r.status_code}: {r.text[:150]}")
        j = r.json()
        if api == "chat":
            return j["choices"][0]["message"]["content"] or "", j["usage"]["completion_tokens"]
        if api == "completions":
            return j["choices"][0]["text"], j["usage"]["completion_tokens"]
        if api == "responses":
            if j["status"] not in ("completed", "incomplete"):
                raise RuntimeError(f"responses status {j['status']}: {j.get('error')}")
            text = "".join(c.get("text", "") for o in j["output"] if o["type"] == "message"
                           for c in o["content"])  # fmt: skip
            return text, j["usage"]["output_tokens"]
        text = "".join(c.get("text", "") for c in j["content"] if c["type"] == "text")
        return text, j["usage"]["output_tokens"]
    with http.stream("POST", path, json=body) as r:
        if r.status_code != 200:
            r.read()
            raise RuntimeError(f"{api} stream HTTP {r.status_code}: {r.text[:150]}")
        events = sse_events(r)
    text, n_out = "", 0
    for e in events:
        if "error" in e and e.get("type") in (None, "error"):
            raise RuntimeError(f"{api} stream error event: {json.dumps(e)[:150]}")
        if api == "chat":
            for c in e.get("choices", []):
                text += c.get("delta", {}).get("content") or ""
                if c.get("finish_reason") == "error":
                    raise RuntimeError("chat stream finish_reason error")
            if e.get("usage"):
                n_out = e["usage"]["completion_tokens"]
        elif api == "completions":
            for c in e.get("choices", []):
                text += c.get("text") or ""
            if e.get("usage"):
                n_out = e["usage"]["completion_tokens"]
        elif api == "responses":
            if e.get("type") == "response.output_text.delta":
                text += e["delta"]
            elif e.get("type") in ("response.failed", "error"):
                raise RuntimeError(f"responses stream {e.get('type')}")
            elif e.get("type") in ("response.completed", "response.incomplete"):
                n_out = e["response"]["usage"]["output_tokens"]
        else:
            if e.get("type") == "content_block_delta" and e["delta"].get("type") == "text_delta":
                text += e["delta"]["text"]
            elif e.get("type") == "message_delta":
                n_out = e["usage"]["output_tokens"]
    if n_out < 1:
        raise RuntimeError(f"{api} stream ended without usage")
    return text, n_out


def client_loop(url: str, index: int, deadline: float, tally: Tally, args) -> None:
    turns: list[tuple[str, str]] = []
    chars = 0
    step = index  # clients start on different APIs
    with httpx.Client(base_url=url, timeout=args.request_timeout) as http:
        while time.monotonic() < deadline:
            api = APIS[step % len(APIS)]
            stream = (step // len(APIS)) % 2 == 1
            step += 1
            topic = TOPICS[(step * 7 + index) % len(TOPICS)]
            user = f"Client {index}, turn {len(turns)}: tell me one fact about {topic}."
            turns.append((user, ""))
            try:
                reply, n_out = one_request(http, api, stream, turns, args.max_tokens)
                turns[-1] = (user, reply)
                chars += len(user) + len(reply)
                tally.ok(api + ("+stream" if stream else ""), n_out)
            except (httpx.HTTPError, RuntimeError, KeyError, ValueError) as e:
                tally.fail(api + ("+stream" if stream else ""), f"{type(e).__name__}: {e}")
                turns.pop()
            if chars > args.reset_chars:  # a new conversation
                turns, chars = [], 0


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--minutes", type=float, default=30.0)
    ap.add_argument(
        "--warmup-minutes",
        type=float,
        default=None,
        help="RSS baseline taken after this long (default: 10%% of the run, ≥ 1)",
    )
    ap.add_argument("--clients", type=int, default=3)
    ap.add_argument("--max-tokens", type=int, default=24)
    ap.add_argument(
        "--reset-chars",
        type=int,
        default=3000,
        help="a conversation restarts once its text passes this many characters",
    )
    ap.add_argument("--request-timeout", type=float, default=300.0)
    ap.add_argument("--model", default="")
    ap.add_argument("--ctx", type=int, default=2048)
    ap.add_argument("--slots", type=int, default=2)
    ap.add_argument("--threads", type=int, default=0)
    ap.add_argument(
        "--state-dir",
        type=Path,
        default=None,
        help="daemon state (kv checkpoints, log); default a temporary directory",
    )
    args = ap.parse_args()  # fmt: skip
    warmup = args.warmup_minutes if args.warmup_minutes is not None else max(1.0, args.minutes / 10)
    state = args.state_dir or Path(tempfile.mkdtemp(prefix="ds4d-soak-"))
    state.mkdir(parents=True, exist_ok=True)
    runtime = Path(tempfile.mkdtemp(prefix="ds4d-soak-rt-"))
    env = private_env({"XDG_CACHE_HOME": state / "cache", "XDG_RUNTIME_DIR": runtime,
                       "XDG_CONFIG_HOME": state / "config", "XDG_STATE_HOME": state / "xstate"})  # fmt: skip
    serve_args = ["--ctx", str(args.ctx), "--slots", str(args.slots), "--threads",
                  str(args.threads), "--kv-disk", "--kv-disk-dir", str(state / "kv"),
                  "--kv-disk-space-mb", "256"]  # fmt: skip
    if args.model:
        serve_args += ["--model", args.model]
    log_path = state / "ds4d.log"
    daemon = ExitStack()
    try:
        try:
            started = daemon.enter_context(serve_process(
                serve_args, env=env, log_path=log_path, start_timeout=180, stop_timeout=60))  # fmt: skip
        except ServeProcessError as e:
            print(f"{e}\nsee {log_path}", file=sys.stderr)
            return 1
        url, proc = started.url, started.proc
        t0 = time.monotonic()
        deadline = t0 + 60 * args.minutes
        tally = Tally()
        threads = [
            threading.Thread(target=client_loop, args=(url, i, deadline, tally, args), daemon=True)
            for i in range(args.clients)
        ]
        for t in threads:
            t.start()
        rss_start = rss_kib(proc.pid)
        rss_warm = None
        rss_peak = rss_start
        samples: list[tuple[float, int]] = []
        while any(t.is_alive() for t in threads):
            time.sleep(5)  # an RSS sample every 5 s while the clients run
            if proc.poll() is not None:
                print(f"ds4d died with {proc.returncode} during the soak", file=sys.stderr)
                break
            now = time.monotonic() - t0
            rss = rss_kib(proc.pid)
            samples.append((now, rss))
            rss_peak = max(rss_peak, rss)
            if rss_warm is None and now >= 60 * warmup:
                rss_warm = rss
        for t in threads:
            t.join(args.request_timeout)
        elapsed = time.monotonic() - t0
        rss_end = rss_kib(proc.pid) if proc.poll() is None else 0
        alive = proc.poll() is None
    finally:
        daemon.close()  # SIGTERM, SIGKILL after 60 s
    log_text = log_path.read_text(errors="replace")
    total = sum(tally.requests.values())
    errors = sum(tally.errors.values())
    print(f"soak: {args.clients} clients, {elapsed / 60:.1f} min, ctx {args.ctx}, "
          f"slots {args.slots}, max_tokens {args.max_tokens}")  # fmt: skip
    print(f"requests {total}, errors {errors}, output tokens {tally.tokens_out}")
    for api in sorted(tally.requests):
        print(f"  {api:20s} {tally.requests[api]:6d} requests {tally.errors[api]:4d} errors")
    warm = rss_warm or rss_start
    growth = 100.0 * (rss_end - warm) / warm if warm and rss_end else float("nan")
    print(f"RSS KiB: start {rss_start}, after {warmup:.1f} min warm-up {warm}, end {rss_end}, "
          f"peak {rss_peak}; growth warm-up -> end {growth:+.2f}%")  # fmt: skip
    print(f"daemon alive at end: {alive}, exit code {proc.returncode}")
    print(f"log: {log_text.count('Traceback')} tracebacks, "
          f"{log_text.count(' ERROR ')} ERROR lines; state in {state}")  # fmt: skip
    for text, n in tally.error_texts.most_common(10):
        print(f"  {n} x {text}")
    (state / "rss.csv").write_text("".join(f"{t:.1f},{r}\n" for t, r in samples))
    return 0 if errors == 0 and alive else 1


if __name__ == "__main__":
    sys.exit(main())
