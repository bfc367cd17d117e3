"""Soak figures: concurrent clients against one real ds4d process for a while.

Each client thread holds its own conversation and loops until the time is up: it picks one
of the four APIs (OpenAI chat completions, completions, responses, Anthropic messages)
and streaming or not in turn, sends the conversation so far plus a new user turn, appends
the reply, and starts a new conversation once the tokens it leaves in its slot (prompt
plus reply) pass --reset-tokens (so the KV cache sees growing conversations, prefix
reuse, evictions and disk checkpoints, and no prompt outgrows the context).

Conversations cycle at that fixed length, so the KV rows a slot ever touches (resident
pages of its calloc'd cache) are bounded by it: the RSS baseline is taken once the
warm-up time has passed and every client has completed --warmup-cycles conversations,
so that reaching the bound is part of the warm-up and growth after it is not.

Printed at the end: requests and errors per API; the daemon's RSS once a minute, split by
mapping (model file, brk heap, anonymous, other files), with requests, errors, the
longest slot use so far and the tokens each slot holds; RSS at the baseline, midway and
the end and the growth between them. With --probe the daemon runs under
scripts/ops/soak_probe.py and the report adds what grew inside it (malloc counters, Python
objects by type, with --tracemalloc the allocation sites). Every sample goes to
samples.csv in the state directory. Exit 1 on any error, or if the median RSS of the
last --window-minutes is --max-growth % or more above that of the window after the
baseline.

Usage (the embedded SmolLM2 model unless --model):
    nice -n 10 .venv/bin/python scripts/ops/soak.py --minutes 30 --clients 3
A measuring tool, not a test: every request loop is bounded by the deadline and by a
per-request timeout; traffic goes to 127.0.0.1 only.
"""

from __future__ import annotations

import argparse
import json
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections import Counter
from contextlib import ExitStack
from dataclasses import dataclass, field
from pathlib import Path

import httpx

from ds4d.daemon import admin_protocol
from ds4d.tools.serve_process import ServeProcessError, private_env, serve_process

TOPICS = [
    "rivers", "bread", "compilers", "the moon", "chess", "gardens", "trains", "music",
    "volcanoes", "bees", "lighthouses", "maps", "glass", "clocks", "the sea", "paper",
]  # fmt: skip
APIS = ("chat", "completions", "responses", "anthropic")


@dataclass
class Tally:
    n_clients: int
    lock: threading.Lock = field(default_factory=threading.Lock)
    requests: Counter = field(default_factory=Counter)
    errors: Counter = field(default_factory=Counter)
    error_texts: Counter = field(default_factory=Counter)
    tokens_out: int = 0
    longest: int = 0  # the most tokens a request left in its slot (prompt + reply)
    cycles: list[int] = field(default_factory=list)  # conversations each client completed

    def __post_init__(self) -> None:
        self.cycles = [0] * self.n_clients

    def ok(self, api: str, n_in: int, n_out: int) -> None:
        with self.lock:
            self.requests[api] += 1
            self.tokens_out += n_out
            self.longest = max(self.longest, n_in + n_out)

    def fail(self, api: str, text: str) -> None:
        with self.lock:
            self.requests[api] += 1
            self.errors[api] += 1
            self.error_texts[text[:200]] += 1

    def cycled(self, index: int) -> None:
        with self.lock:
            self.cycles[index] += 1

    def counts(self) -> tuple[int, int, int, int]:
        """requests, errors, longest, fewest conversations completed by a client"""
        with self.lock:
            return (sum(self.requests.values()), sum(self.errors.values()), self.longest,
                    min(self.cycles))  # fmt: skip


def sse_events(resp: httpx.Response) -> list[dict]:
    """The JSON data of every SSE event of a streamed response, in order."""
    out = []
    for line in resp.iter_lines():
        if line.startswith("data:"):
            data = line[5:].strip()
            if data and data != "[DONE]":
                out.append(json.loads(data))
    return out


def anthropic_prompt_tokens(usage: dict) -> int:
    """The whole prompt: Anthropic's usage splits it into plain input and cache reads/writes."""
    return sum(usage.get(k) or 0 for k in ("input_tokens", "cache_read_input_tokens",
                                          "cache_creation_input_tokens"))  # fmt: skip


def one_request(
    http: httpx.Client, api: str, stream: bool, turns: list[tuple[str, str]], max_tokens: int
) -> tuple[str, int, int]:
    """Sends the conversation (user, assistant)* + the last user turn; returns the reply
    text, the prompt tokens and the completion tokens. Raises RuntimeError on any
    protocol-level error."""
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
        u = j["usage"]
        if api == "chat":
            text = j["choices"][0]["message"]["content"] or ""
            return text, u["prompt_tokens"], u["completion_tokens"]
        if api == "completions":
            return j["choices"][0]["text"], u["prompt_tokens"], u["completion_tokens"]
        if api == "responses":
            if j["status"] not in ("completed", "incomplete"):
                raise RuntimeError(f"responses status {j['status']}: {j.get('error')}")
            text = "".join(c.get("text", "") for o in j["output"] if o["type"] == "message"
                           for c in o["content"])  # fmt: skip
            return text, u["input_tokens"], u["output_tokens"]
        text = "".join(c.get("text", "") for c in j["content"] if c["type"] == "text")
        return text, anthropic_prompt_tokens(u), u["output_tokens"]
    with http.stream("POST", path, json=body) as r:
        if r.status_code != 200:
            r.read()
            raise RuntimeError(f"{api} stream HTTP {r.status_code}: {r.text[:150]}")
        events = sse_events(r)
    text, n_in, n_out = "", 0, 0
    for e in events:
        if "error" in e and e.get("type") in (None, "error"):
            raise RuntimeError(f"{api} stream error event: {json.dumps(e)[:150]}")
        if api == "chat":
            for c in e.get("choices", []):
                text += c.get("delta", {}).get("content") or ""
                if c.get("finish_reason") == "error":
                    raise RuntimeError("chat stream finish_reason error")
            if e.get("usage"):
                n_in, n_out = e["usage"]["prompt_tokens"], e["usage"]["completion_tokens"]
        elif api == "completions":
            for c in e.get("choices", []):
                text += c.get("text") or ""
            if e.get("usage"):
                n_in, n_out = e["usage"]["prompt_tokens"], e["usage"]["completion_tokens"]
        elif api == "responses":
            if e.get("type") == "response.output_text.delta":
                text += e["delta"]
            elif e.get("type") in ("response.failed", "error"):
                raise RuntimeError(f"responses stream {e.get('type')}")
            elif e.get("type") in ("response.completed", "response.incomplete"):
                usage = e["response"]["usage"]
                n_in, n_out = usage["input_tokens"], usage["output_tokens"]
        else:
            if e.get("type") == "content_block_delta" and e["delta"].get("type") == "text_delta":
                text += e["delta"]["text"]
            elif e.get("type") == "message_delta":
                n_in, n_out = anthropic_prompt_tokens(e["usage"]), e["usage"]["output_tokens"]
    if n_out < 1:
        raise RuntimeError(f"{api} stream ended without usage")
    return text, n_in, n_out


def client_loop(url: str, index: int, deadline: float, tally: Tally, args) -> None:
    turns: list[tuple[str, str]] = []
    used = 0  # tokens the last turn left in its slot
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
                reply, n_in, n_out = one_request(http, api, stream, turns, args.max_tokens)
                turns[-1] = (user, reply)
                used = n_in + n_out
                tally.ok(api + ("+stream" if stream else ""), n_in, n_out)
            except (httpx.HTTPError, RuntimeError, KeyError, ValueError) as e:
                tally.fail(api + ("+stream" if stream else ""), f"{type(e).__name__}: {e}")
                turns.pop()
            if used > args.reset_tokens:  # a new conversation: lengths cycle at this bound
                turns, used = [], 0
                tally.cycled(index)


# ---- what is measured in the daemon process -----------------------------------------------


def rss_kib(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1])
    return 0


RSS_CLASSES = ("model", "heap", "anon", "files")


def rss_by_mapping(pid: int, model_path: str) -> dict[str, int]:
    """Resident KiB by kind of mapping: the model file (its mmapped weights), the brk
    heap (glibc's main arena), anonymous mappings (KV caches, mmapped malloc chunks, other
    threads' arenas, Python's arenas, stacks), other files (libraries)."""
    out = dict.fromkeys(RSS_CLASSES, 0)
    kind = "anon"
    try:
        text = Path(f"/proc/{pid}/smaps").read_text()
    except OSError:
        return out
    for line in text.splitlines():
        first = line.split(None, 1)[0]
        if "-" in first and not first.endswith(":"):  # a mapping's header line
            parts = line.split(None, 5)
            name = parts[5].strip() if len(parts) > 5 else ""
            if name == "[heap]":
                kind = "heap"
            elif not name or name.startswith("["):
                kind = "anon"
            elif model_path and name == model_path or name.endswith(".gguf"):
                kind = "model"
            else:
                kind = "files"
        elif first == "Rss:":
            out[kind] += int(line.split()[1])
    return out


def snapshot_kib(sock: Path) -> int:
    """KiB the daemon holds in KV snapshots queued for the checkpoint writer (0 when it
    does not answer)."""
    try:
        cache = admin_protocol.call(sock, "status", timeout=10).get("cache") or {}
        return int(cache.get("pending_bytes", 0)) // 1024
    except (OSError, admin_protocol.AdminError, ValueError, TypeError, AttributeError):
        return 0


def slot_tokens(sock: Path) -> list[int]:
    """Tokens each slot holds now (the admin socket's `slots`); [] when it does not answer."""
    try:
        return [int(s["tokens"]) for s in admin_protocol.call(sock, "slots", timeout=10)]
    except (OSError, admin_protocol.AdminError, ValueError, KeyError, TypeError):
        return []


@dataclass
class Sample:
    t: float  # seconds since the clients started
    rss: int  # KiB
    by_mapping: dict[str, int]
    requests: int
    errors: int
    longest: int  # most tokens a request has left in a slot so far
    slot_tokens: list[int]
    cycles: int  # fewest conversations completed by any client
    snapshot: int = 0  # KiB of KV snapshots held for the writer, read on both sides of rss

    @property
    def steady(self) -> int:
        """RSS without the snapshots waiting to be written: each is one block, freed (and
        given back, being above malloc's fixed mmap threshold) once its file is written."""
        return self.rss - self.snapshot


def take_probe(proc: subprocess.Popen, probe_dir: Path, n: int, timeout: float = 120) -> dict:
    """SIGUSR1 to the probe wrapper; its probe-N.json (bounded wait)."""
    proc.send_signal(signal.SIGUSR1)
    path = probe_dir / f"probe-{n}.json"
    deadline = time.monotonic() + timeout
    while not path.exists():
        if time.monotonic() > deadline or proc.poll() is not None:
            return {}
        time.sleep(0.2)  # waiting on another process's file, bounded
    return json.loads(path.read_text())


def probe_diff(a: dict, b: dict, top: int = 12) -> list[str]:
    """What grew between two probes: malloc counters, gc object types, tracemalloc lines."""
    lines = []
    ma, mb = a.get("mallinfo2"), b.get("mallinfo2")
    if ma and mb:
        lines.append("malloc (KiB, warm-up -> end): " + ", ".join(
            f"{k} {ma[k] // 1024} -> {mb[k] // 1024}"
            for k in ("arena", "uordblks", "fordblks", "hblkhd", "keepcost")))  # fmt: skip
        lines.append("  (arena: main+thread heaps; uordblks in use; fordblks free in them; "
                     "hblkhd mmapped chunks, KV caches among them)")  # fmt: skip
    lines.append(f"gc-tracked objects: {a.get('gc_objects')} -> {b.get('gc_objects')}")
    ta, tb = a.get("gc_types", {}), b.get("gc_types", {})
    grown = sorted(((tb.get(k, 0) - ta.get(k, 0), k) for k in set(ta) | set(tb)), reverse=True)
    lines += [f"  {d:+d} {k}" for d, k in grown[:top] if d > 0]
    if a.get("snapshot") and b.get("snapshot"):
        import tracemalloc

        lines.append(f"tracemalloc: {a['tracemalloc_current'] // 1024} KiB -> "
                     f"{b['tracemalloc_current'] // 1024} KiB traced")  # fmt: skip
        sa = tracemalloc.Snapshot.load(a["snapshot"])
        sb = tracemalloc.Snapshot.load(b["snapshot"])
        for st in sb.compare_to(sa, "traceback")[:top]:
            if st.size_diff <= 0:
                continue
            recent = list(st.traceback)[::-1][:5]  # the allocating line first, then its callers
            frames = " <- ".join(f"{Path(f.filename).name}:{f.lineno}" for f in recent)
            lines.append(f"  {st.size_diff / 1024:+.0f} KiB ({st.count_diff:+d}) {frames}")
    return lines


def growth(a: int, b: int) -> float:
    return 100.0 * (b - a) / a if a and b else float("nan")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--minutes", type=float, default=30.0)
    ap.add_argument(
        "--warmup-minutes",
        type=float,
        default=None,
        help="RSS baseline no earlier than this (default: 10%% of the run, ≥ 1)",
    )
    ap.add_argument(
        "--warmup-cycles",
        type=int,
        default=2,
        help="and not before every client has completed this many conversations "
        "(the KV rows a conversation touches are bounded by --reset-tokens)",
    )
    ap.add_argument("--clients", type=int, default=3)
    ap.add_argument("--max-tokens", type=int, default=24)
    ap.add_argument(
        "--reset-tokens",
        type=int,
        default=None,
        help="a conversation restarts once its prompt and reply pass this many tokens "
        "(default: 3/4 of --ctx, leaving room for one more turn)",
    )
    ap.add_argument("--request-timeout", type=float, default=300.0)
    ap.add_argument("--sample-seconds", type=float, default=5.0)
    ap.add_argument(
        "--max-growth",
        type=float,
        default=5.0,
        help="exit 1 if RSS grows this many %% or more after the baseline",
    )
    ap.add_argument(
        "--window-minutes",
        type=float,
        default=2.0,
        help="the growth compares the RSS medians of this long after the baseline and at the end",
    )
    ap.add_argument("--model", default="")
    ap.add_argument("--ctx", type=int, default=2048)
    ap.add_argument("--slots", type=int, default=2)
    ap.add_argument("--threads", type=int, default=0)
    ap.add_argument(
        "--probe",
        action="store_true",
        help="run ds4d under scripts/ops/soak_probe.py: malloc counters and Python "
        "objects at the baseline and the end",
    )
    ap.add_argument(
        "--tracemalloc",
        type=int,
        default=0,
        metavar="FRAMES",
        help="with --probe: tracemalloc with this many frames, top growth shown",
    )
    ap.add_argument(
        "--state-dir",
        type=Path,
        default=None,
        help="daemon state (kv checkpoints, log); default a temporary directory",
    )
    args = ap.parse_args()  # fmt: skip
    if args.reset_tokens is None:
        args.reset_tokens = 3 * args.ctx // 4
    warmup = args.warmup_minutes if args.warmup_minutes is not None else max(1.0, args.minutes / 10)
    state = args.state_dir or Path(tempfile.mkdtemp(prefix="ds4d-soak-"))
    state.mkdir(parents=True, exist_ok=True)
    runtime = Path(tempfile.mkdtemp(prefix="ds4d-soak-rt-"))
    env = private_env({"XDG_CACHE_HOME": state / "cache", "XDG_RUNTIME_DIR": runtime,
                       "XDG_CONFIG_HOME": state / "config", "XDG_STATE_HOME": state / "xstate"})  # fmt: skip
    admin_sock = admin_protocol.default_socket_path(env)
    launcher: tuple[str, ...] = ("-m", "ds4d")
    probe_dir = state / "probe"
    if args.probe or args.tracemalloc:
        launcher = (str(Path(__file__).with_name("soak_probe.py")),)
        env["DS4D_SOAK_PROBE_DIR"] = str(probe_dir)
        env["DS4D_SOAK_TRACEMALLOC"] = str(args.tracemalloc)
    serve_args = ["--ctx", str(args.ctx), "--slots", str(args.slots), "--threads",
                  str(args.threads), "--kv-disk", "--kv-disk-dir", str(state / "kv"),
                  "--kv-disk-space-mb", "256"]  # fmt: skip
    if args.model:
        serve_args += ["--model", args.model]
    log_path = state / "ds4d.log"
    samples: list[Sample] = []
    warm: Sample | None = None
    probes: list[dict] = []
    tally = Tally(args.clients)
    model_path = ""
    daemon = ExitStack()
    try:
        try:
            started = daemon.enter_context(serve_process(
                serve_args, env=env, log_path=log_path, start_timeout=180, stop_timeout=60,
                launcher=launcher))  # fmt: skip
        except ServeProcessError as e:
            print(f"{e}\nsee {log_path}", file=sys.stderr)
            return 1
        url, proc = started.url, started.proc
        try:
            model_path = str(admin_protocol.call(admin_sock, "status").get("model_path") or "")
        except (OSError, admin_protocol.AdminError):
            pass
        t0 = time.monotonic()
        deadline = t0 + 60 * args.minutes
        threads = [
            threading.Thread(target=client_loop, args=(url, i, deadline, tally, args), daemon=True)
            for i in range(args.clients)
        ]
        for t in threads:
            t.start()

        def sample() -> Sample:
            n, e, longest, cycles = tally.counts()
            held_before = snapshot_kib(admin_sock)
            rss = rss_kib(proc.pid)
            # the smaller of the two: a snapshot taken or freed in between is counted as
            # part of the RSS, never subtracted from it
            held = min(held_before, snapshot_kib(admin_sock))
            return Sample(time.monotonic() - t0, rss, rss_by_mapping(proc.pid, model_path),
                          n, e, longest, slot_tokens(admin_sock), cycles, held)  # fmt: skip

        samples.append(sample())
        next_at = time.monotonic()
        while any(t.is_alive() for t in threads):
            next_at += args.sample_seconds
            time.sleep(max(0.0, next_at - time.monotonic()))
            if proc.poll() is not None:
                print(f"ds4d died with {proc.returncode} during the soak", file=sys.stderr)
                break
            s = sample()
            samples.append(s)
            if warm is None and s.t >= 60 * warmup and s.cycles >= args.warmup_cycles:
                warm = s
                if args.probe or args.tracemalloc:
                    # The probe's own allocations (a tracemalloc snapshot is tens of MB)
                    # stay in the heap: the baseline is the sample after it.
                    probes.append(take_probe(proc, probe_dir, 1))
                    warm = sample()
                    samples.append(warm)
        for t in threads:
            t.join(args.request_timeout)
        if proc.poll() is None:
            samples.append(sample())
            if warm is not None and (args.probe or args.tracemalloc):
                probes.append(take_probe(proc, probe_dir, 2))
        alive = proc.poll() is None
    finally:
        daemon.close()  # SIGTERM, SIGKILL after 60 s
    return report(args, state, log_path, tally, samples, warm, probes, alive, proc.returncode)


def report(args, state: Path, log_path: Path, tally: Tally, samples: list[Sample],
           warm: Sample | None, probes: list[dict], alive: bool, code: int | None) -> int:  # fmt: skip
    log_text = log_path.read_text(errors="replace")
    total, errors, longest, cycles = tally.counts()
    first, end = samples[0], samples[-1]
    elapsed = end.t
    print(
        f"soak: {args.clients} clients, {elapsed / 60:.1f} min, ctx {args.ctx}, "
        f"slots {args.slots}, max_tokens {args.max_tokens}, reset at {args.reset_tokens} tokens"
    )
    print(
        f"requests {total}, errors {errors}, output tokens {tally.tokens_out}; conversations "
        f"completed per client {tally.cycles}; longest slot use {longest} tokens"
    )
    for api in sorted(tally.requests):
        print(f"  {api:20s} {tally.requests[api]:6d} requests {tally.errors[api]:4d} errors")
    print("RSS series (MiB; by mapping: model file, brk heap, anonymous, other files):")
    print("    min    RSS  model   heap   anon  files  snaps  requests errors longest slots")
    step = max(1, int(60 / args.sample_seconds))  # one line a minute, the baseline and end too
    shown = [s for i, s in enumerate(samples) if i % step == 0 or s is warm or s is end]
    for s in shown:
        m = s.by_mapping
        mark = "  <- baseline" if s is warm else ""
        print(f"  {s.t / 60:5.1f} {s.rss / 1024:6.1f} {m['model'] / 1024:6.1f} "
              f"{m['heap'] / 1024:6.1f} {m['anon'] / 1024:6.1f} {m['files'] / 1024:6.1f} "
              f"{s.snapshot / 1024:6.1f} {s.requests:9d} {s.errors:6d} {s.longest:7d} {s.slot_tokens}{mark}")  # fmt: skip
    ok = errors == 0 and alive
    if warm is None:
        print(f"RSS growth: no baseline - the warm-up ({args.warmup_cycles} conversations per "
              f"client) did not finish within the run")  # fmt: skip
        ok = False
    else:
        mid = min(samples, key=lambda s: abs(s.t - (warm.t + end.t) / 2))
        g = growth(warm.rss, end.rss)
        print(f"RSS KiB: start {first.rss}, baseline at {warm.t / 60:.1f} min {warm.rss}, "
              f"midway at {mid.t / 60:.1f} min {mid.rss}, end {end.rss}, "
              f"peak {max(s.rss for s in samples)}")  # fmt: skip
        print(f"RSS growth baseline -> end {g:+.2f}% (second half {growth(mid.rss, end.rss):+.2f}%)"
              f"; longest slot use {warm.longest} -> {end.longest} tokens")  # fmt: skip
        for k in RSS_CLASSES:
            print(
                f"  {k:6s} {warm.by_mapping[k] / 1024:7.1f} -> {end.by_mapping[k] / 1024:7.1f} MiB"
            )
        # Single samples swing by the blocks in flight at that instant (KV snapshots queued
        # for the checkpoint writer, up to its queue of four; a prefill workspace: tens of
        # MiB, freed a moment later). The verdict compares medians of the window after the
        # baseline and the last one, of the RSS without the snapshots the daemon reports
        # holding; the raw RSS medians are printed beside it.
        w = 60 * args.window_minutes
        after_s = [s for s in samples if warm.t <= s.t <= warm.t + w]
        last_s = [s for s in samples if s.t >= end.t - w and s.t >= warm.t]

        def medians(key) -> tuple[float, float, float]:
            a = statistics.median(key(s) for s in after_s)
            b = statistics.median(key(s) for s in last_s)
            return a, b, growth(int(a), int(b))

        raw_a, raw_b, g_raw = medians(lambda s: s.rss)
        a, b, g_median = medians(lambda s: s.steady)
        print(f"RSS growth (raw), median of {args.window_minutes:g} min after the baseline "
              f"({raw_a:.0f} KiB, {len(after_s)} samples) -> median of the last "
              f"{args.window_minutes:g} min ({raw_b:.0f} KiB, {len(last_s)} samples): "
              f"{g_raw:+.2f}%")  # fmt: skip
        print(f"RSS growth without queued KV snapshots (the verdict), the same windows: "
              f"{a:.0f} -> {b:.0f} KiB, {g_median:+.2f}% (limit {args.max_growth:g}%); "
              f"snapshots held in {sum(1 for s in samples if s.snapshot)} of {len(samples)} "
              f"samples, at most {max(s.snapshot for s in samples) / 1024:.1f} MiB")  # fmt: skip
        ok = ok and g_median < args.max_growth
    if len(probes) == 2 and probes[0] and probes[1]:
        print("probe (the daemon's own view, baseline -> end):")
        for line in probe_diff(probes[0], probes[1]):
            print("  " + line)
    print(f"daemon alive at end: {alive}, exit code {code}")
    print(f"log: {log_text.count('Traceback')} tracebacks, "
          f"{log_text.count(' ERROR ')} ERROR lines; state in {state}")  # fmt: skip
    for text, n in tally.error_texts.most_common(10):
        print(f"  {n} x {text}")
    with open(state / "samples.csv", "w") as f:
        f.write("t_s,rss_kib," + ",".join(f"{k}_kib" for k in RSS_CLASSES)
                + ",snapshot_kib,requests,errors,longest,cycles,slot_tokens\n")  # fmt: skip
        for s in samples:
            f.write(f"{s.t:.1f},{s.rss}," + ",".join(str(s.by_mapping[k]) for k in RSS_CLASSES)
                    + f",{s.snapshot},{s.requests},{s.errors},{s.longest},{s.cycles},"
                    + " ".join(map(str, s.slot_tokens)) + "\n")  # fmt: skip
    print(f"samples: {state / 'samples.csv'}")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
