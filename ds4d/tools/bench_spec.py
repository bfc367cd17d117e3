"""`ds4d bench spec`: decode tokens/s with speculative decoding off, by prompt lookup and
with a draft model, on agent-shaped workloads, through real servers over HTTP; and the
same for llama.cpp's llama-server (`--spec-type ngram-simple`, `draft-simple`) when
`--llama-server` is given.

The workloads are completion-style prompts (`/v1/completions`, greedy, no chat template),
so that even a small model copies what it should:

  rewrite  a source file (by default one of ds4d's own, ~190 lines) and the start of the
           same file "with one rename": the model writes the file again
  edit     the file and the start of an edit tool call's JSON: its old_string copies
           lines of the file, its new_string mostly repeats them
  prose    a paragraph of a story to continue (drafts mostly fail: the cost of trying)

ds4d runs as one server per speculative mode it has (`--speculative lookup`, and
`--speculative draft --draft-model` when a draft model is given), both running, the modes
taking turns within each workload in an order that rotates with the round; "off" is the
lookup server's request opt-out (`"speculative": false`). llama-server runs one mode at a
time (its idle threads poll for work). Every request of a workload starts from the same
KV state: a two-token request of the same prompt just before, so the measured one reuses
the whole prompt (a prompt prefilled to its end and one reused from the slot can give
last-bit different logits, and a different greedy text), and a draft model's session
holds it already (its session evaluates a new prompt as prefill work). The decode rate is the
server's own: ds4d's /metrics (generated tokens over decode seconds, drafted and accepted
tokens), llama-server's response `timings` (predicted tokens over predicted ms,
draft_n, draft_n_accepted).

The rows are printed, with the CPU and the load average beside them; --csv and --plot
write them. A measuring tool: it asserts nothing, but says when two greedy outputs of one
server differ (they should not).
"""

from __future__ import annotations

import argparse
import csv
import dataclasses
import http.client
import importlib.util
import json
import os
import platform
import statistics
import urllib.parse
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ds4d.daemon.exitcodes import CliError
from ds4d.tools.serve_process import (
    ServeProcessError,
    free_port,
    other_server,
    parse_metrics,
    private_daemon,
    sigterm_unwinds,
)

DEFAULT_FILE = Path(__file__).resolve().parents[1] / "chat" / "types.py"
START_TIMEOUT_S = 300
PROSE = (
    "The lighthouse keeper had not seen a ship in eleven days. Each morning he climbed the "
    "hundred and twelve steps, wiped the salt from the great lens, and wrote the same line in "
    "the logbook: wind from the west, sea calm, nothing on the horizon. On the twelfth "
    "morning the fog came in so thick that he could not see the rocks below the tower, and "
    "somewhere inside it, faint and slow, a bell was ringing."
)
CSV_FIELDS = ("server", "mode", "workload", "round", "tokens", "decode_s", "tok_s",
              "speedup", "drafted", "accepted", "acceptance", "same_text", "load", "cpu",
              "model", "draft_model")  # fmt: skip


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--model", type=Path, help="the target GGUF (default: the embedded model)")
    p.add_argument("--draft-model", type=Path, help="a GGUF of the same vocabulary to draft")
    p.add_argument("--file", type=Path, default=DEFAULT_FILE,
                   help="the source file the rewrite and edit workloads copy")  # fmt: skip
    p.add_argument("--rename", default="ChatRequest=GenerationRequest",
                   help="the rewrite's one change, OLD=NEW")  # fmt: skip
    p.add_argument("--workloads", default="rewrite,edit,prose")
    p.add_argument("--tokens", type=int, default=256, help="tokens generated per request")
    p.add_argument("--rounds", type=int, default=2)
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--ctx", type=int, default=4096)
    p.add_argument("--llama-server", type=Path, help="llama.cpp's llama-server binary")
    p.add_argument("--llama-wait", choices=("auto", "passive", "active"), default="auto",
                   help="llama-server's OpenMP threads between tasks: passive sleep, active "
                        "spin (its default); auto: passive when the load average is at "
                        "least the core count")  # fmt: skip
    p.add_argument("--csv", type=Path, help="write the rows here")
    p.add_argument("--plot", type=Path, help="PNG of tokens/s per workload and mode")
    p.add_argument("--timeout", type=float, default=1800)


# ---- the workloads ----------------------------------------------------------------------


def workloads(source: Path, rename: str) -> dict[str, str]:
    text = source.read_text()
    name = source.name
    old, _, new = rename.partition("=")
    first = text.splitlines(keepends=True)[0]
    return {
        "rewrite": (
            f"### {name}\n{text}### end of {name}\n\n"
            f"### {name}, the same file with {old} renamed to {new} and nothing else "
            f"changed\n{first.replace(old, new)}"
        ),
        "edit": (
            f"### {name}\n{text}### end of {name}\n\n"
            f"An edit of {name} that renames {old} to {new} where it is defined, as the "
            f'JSON arguments of an edit tool:\n{{"file_path": "{name}", "old_string": "'
        ),
        "prose": PROSE + " ",
    }


# ---- the servers ------------------------------------------------------------------------


@dataclass(frozen=True)
class Result:
    text: str
    tokens: int
    decode_s: float
    drafted: int
    accepted: int
    load: str = ""  # the load average when it was measured


def post(url: str, path: str, body: dict[str, Any], timeout: float) -> dict[str, Any]:
    u = urllib.parse.urlsplit(url)
    conn = http.client.HTTPConnection(u.hostname or "127.0.0.1", u.port, timeout=timeout)
    try:
        conn.request("POST", path, json.dumps(body), {"Content-Type": "application/json"})
        resp = conn.getresponse()
        data = resp.read()
        if resp.status != 200:
            raise CliError(f"{url}{path}: HTTP {resp.status}: {data[:300]!r}")
        out: dict[str, Any] = json.loads(data)
        return out
    finally:
        conn.close()


def metrics(url: str) -> dict[str, float]:
    u = urllib.parse.urlsplit(url)
    conn = http.client.HTTPConnection(u.hostname or "127.0.0.1", u.port, timeout=30)
    try:
        conn.request("GET", "/metrics")
        text = conn.getresponse().read().decode()
    finally:
        conn.close()
    return parse_metrics(text)


class Ds4dServer:
    """A ds4d serve whose requests opt in or out of its speculative mode."""

    def __init__(self, url: str, speculative: bool, timeout: float) -> None:
        self.url = url
        self.speculative = speculative
        self.timeout = timeout

    def complete(self, prompt: str, tokens: int) -> Result:
        before = metrics(self.url)
        body = {"prompt": prompt, "max_tokens": tokens, "temperature": 0,
                "speculative": self.speculative}  # fmt: skip
        r = post(self.url, "/v1/completions", body, self.timeout)
        after = metrics(self.url)

        def delta(name: str) -> float:
            return after.get(name, 0.0) - before.get(name, 0.0)

        return Result(r["choices"][0]["text"], int(delta("ds4d_generated_tokens_total")),
                      delta("ds4d_decode_seconds_total"),
                      int(delta("ds4d_speculative_drafted_tokens_total")),
                      int(delta("ds4d_speculative_accepted_tokens_total")))  # fmt: skip


class LlamaServer:
    def __init__(self, url: str, timeout: float) -> None:
        self.url = url
        self.timeout = timeout

    def complete(self, prompt: str, tokens: int) -> Result:
        body = {"prompt": prompt, "n_predict": tokens, "temperature": 0, "top_k": 1,
                "cache_prompt": True}  # fmt: skip
        r = post(self.url, "/completion", body, self.timeout)
        t = r.get("timings", {})
        return Result(r.get("content", ""), int(t.get("predicted_n", 0)),
                      float(t.get("predicted_ms", 0.0)) / 1000, int(t.get("draft_n", 0)),
                      int(t.get("draft_n_accepted", 0)))  # fmt: skip


@contextmanager
def ds4d_server(args: argparse.Namespace, mode: str) -> Iterator[str]:
    flags = ["--speculative", mode, "--threads", str(args.threads), "--slots", "1",
             "--no-kv-disk", "--ctx", str(args.ctx)]  # fmt: skip
    if args.model:
        flags += ["--model", str(args.model)]
    if mode == "draft":
        flags += ["--draft-model", str(args.draft_model)]
    try:
        with private_daemon(flags, start_timeout=START_TIMEOUT_S) as url:
            yield url
    except ServeProcessError as e:
        raise CliError(str(e)) from None


def llama_wait(choice: str) -> str:
    """OMP_WAIT_POLICY for llama-server. A ggml build with OpenMP spins its threads at
    every synchronisation; when other processes hold the cores, a spinning thread waits
    for one that is not running, and decode collapses (measured, SmolLM2-135M, 2 threads,
    load 9 on 2 cores: 0.7 tokens/s spinning against 34 passive; docs/speculative.md). On
    an idle machine the spin is its default and fastest."""
    if choice != "auto":
        return choice
    return "passive" if os.getloadavg()[0] >= (os.cpu_count() or 1) else "active"


@contextmanager
def llama_server(args: argparse.Namespace, model: Path, spec: list[str]) -> Iterator[str]:
    port = free_port()
    cmd = [str(args.llama_server), "-m", str(model), "--host", "127.0.0.1", "--port", str(port),
           "-t", str(args.threads), "-tb", str(args.threads), "-np", "1", "-c", str(args.ctx),
           *spec]  # fmt: skip
    env = {**os.environ, "OMP_WAIT_POLICY": llama_wait(args.llama_wait)}
    print(f"# llama-server {' '.join(spec) or '(no speculation)'}, OMP_WAIT_POLICY="
          f"{env['OMP_WAIT_POLICY']}, load {load()}", flush=True)  # fmt: skip
    try:
        with other_server(cmd, f"http://127.0.0.1:{port}", START_TIMEOUT_S, env) as url:
            yield url
    except ServeProcessError as e:
        raise CliError(str(e)) from None


# ---- the run ----------------------------------------------------------------------------


def cpu_name() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown"


def load() -> str:
    return " ".join(f"{x:.2f}" for x in os.getloadavg())


Client = Ds4dServer | LlamaServer


Results = dict[tuple[str, int, str], Result]  # (workload, round, mode) -> what it did


def measure(client: Client, prompt: str, tokens: int) -> Result:
    # The same KV state for every mode: the prompt in the slot (and in a draft model's
    # session: its first drafting step evaluates the prompt) from a short request first.
    client.complete(prompt, 2)
    return client.complete(prompt, tokens)


def interleaved(clients: dict[str, Client], prompts: dict[str, str],
                args: argparse.Namespace) -> Results:  # fmt: skip
    """Every workload with every mode, --rounds times, the modes taking turns within each
    workload in an order that rotates with the round."""
    out: Results = {}
    modes = list(clients)
    for rnd in range(args.rounds):
        for workload, prompt in prompts.items():
            for mode in modes[rnd % len(modes) :] + modes[: rnd % len(modes)]:
                r = measure(clients[mode], prompt, args.tokens)
                r = out[workload, rnd, mode] = dataclasses.replace(r, load=load())
                rate = r.tokens / r.decode_s if r.decode_s else float("nan")
                print(f"  measured {workload} round {rnd} {mode}: {rate:.1f} tok/s, drafted "
                      f"{r.drafted} accepted {r.accepted}, load {load()}", flush=True)  # fmt: skip
    return out


def rows_of(results: Results, modes: list[str], server: str, model: str,
            draft: str) -> list[dict[str, Any]]:  # fmt: skip
    """One row per result; the first mode ("off") is the base of each speed-up."""
    rows = []
    cpu = cpu_name()
    for workload, rnd, mode in sorted(results, key=lambda k: (k[1], k[0], modes.index(k[2]))):
        r, base = results[workload, rnd, mode], results[workload, rnd, modes[0]]
        rate = r.tokens / r.decode_s if r.decode_s else float("nan")
        base_rate = base.tokens / base.decode_s if base.decode_s else float("nan")
        row = {
            "server": server, "mode": mode, "workload": workload, "round": rnd,
            "tokens": r.tokens, "decode_s": f"{r.decode_s:.3f}", "tok_s": f"{rate:.2f}",
            "speedup": f"{rate / base_rate:.3f}", "drafted": r.drafted, "accepted": r.accepted,
            "acceptance": f"{r.accepted / r.drafted:.3f}" if r.drafted else "",
            "same_text": r.text == base.text, "load": r.load, "cpu": cpu, "model": model,
            "draft_model": draft,
        }  # fmt: skip
        rows.append(row)
        print(f"{server:9s} {workload:8s} round {rnd} {mode:7s} {rate:7.1f} tok/s "
              f"(x{rate / base_rate:.2f}) drafted {r.drafted:4d} accepted {r.accepted:4d} "
              f"{r.tokens:4d} tokens, same text as {modes[0]}: {r.text == base.text}",
              flush=True)  # fmt: skip
    return rows


def run(args: argparse.Namespace) -> int:
    # Stopped by SIGTERM (a timeout, a job manager), it still stops every server it started.
    with sigterm_unwinds():
        return _run(args)


def _run(args: argparse.Namespace) -> int:
    if args.plot and importlib.util.find_spec("matplotlib") is None:
        raise CliError("--plot needs matplotlib: pip install 'ds4d[plot]'", 2)
    all_prompts = workloads(args.file, args.rename)
    names = [w for w in args.workloads.split(",") if w]
    unknown = [w for w in names if w not in all_prompts]
    if unknown:
        raise CliError(f"unknown workload {unknown[0]!r} (known: {', '.join(all_prompts)})", 2)
    prompts = {w: all_prompts[w] for w in names}
    model = args.model
    if model is None:
        from ds4d.engine.default_model import default_model_path

        model = default_model_path()
    draft = args.draft_model.name if args.draft_model else ""
    print(f"cpu: {cpu_name()}; {args.threads} threads; {args.tokens} tokens a request, greedy;"
          f" model {model.name}; draft {draft or 'none'}; load {load()}")  # fmt: skip
    rows: list[dict[str, Any]] = []
    with ds4d_server(args, "lookup") as lookup_url, _maybe_draft(args) as draft_url:
        clients: dict[str, Client] = {
            "off": Ds4dServer(lookup_url, False, args.timeout),
            "lookup": Ds4dServer(lookup_url, True, args.timeout),
        }
        if draft_url is not None:
            clients["draft"] = Ds4dServer(draft_url, True, args.timeout)
        results = interleaved(clients, prompts, args)
    rows += rows_of(results, list(clients), "ds4d", model.name, draft)
    print(f"load {load()}")
    if args.llama_server:
        # One llama-server at a time: its idle threads poll for work, so servers running
        # together would slow each other.
        specs: dict[str, list[str]] = {"off": [], "lookup": ["--spec-type", "ngram-simple"]}
        if args.draft_model:
            specs["draft"] = ["--spec-type", "draft-simple", "-md", str(args.draft_model)]
        results = {}
        for mode, spec in specs.items():
            with llama_server(args, model, spec) as url:
                one = interleaved({mode: LlamaServer(url, args.timeout)}, prompts, args)
            results.update(one)
        rows += rows_of(results, list(specs), "llama.cpp", model.name, draft)
        print(f"load {load()}")
    if args.csv:
        args.csv.parent.mkdir(parents=True, exist_ok=True)
        with args.csv.open("w", newline="") as f:
            w = csv.DictWriter(f, fieldnames=CSV_FIELDS)
            w.writeheader()
            w.writerows(rows)
        print(f"wrote {args.csv}")
    if args.plot:
        write_plot(args.plot, rows, model.name, draft)
    return 0


@contextmanager
def _maybe_draft(args: argparse.Namespace) -> Iterator[str | None]:
    if args.draft_model is None:
        yield None
        return
    with ds4d_server(args, "draft") as url:
        yield url


def write_plot(path: Path, rows: list[dict[str, Any]], model: str, draft: str) -> None:
    import matplotlib

    matplotlib.use("Agg")  # files only: no display needed
    import matplotlib.pyplot as plt

    series = list(dict.fromkeys((r["server"], r["mode"]) for r in rows))
    workloads_ = list(dict.fromkeys(r["workload"] for r in rows))
    fig, ax = plt.subplots(figsize=(8, 4))
    width = 0.8 / len(series)
    for i, (server, mode) in enumerate(series):
        values = []
        for w in workloads_:
            rates = [float(r["tok_s"]) for r in rows
                     if (r["server"], r["mode"], r["workload"]) == (server, mode, w)]  # fmt: skip
            values.append(statistics.median(rates) if rates else 0.0)
        xs = [j + i * width for j in range(len(workloads_))]
        bars = ax.bar(xs, values, width, label=f"{server} {mode}")
        ax.bar_label(bars, fmt="%.0f", fontsize=7)
    ax.set_xticks([j + width * (len(series) - 1) / 2 for j in range(len(workloads_))])
    ax.set_xticklabels(workloads_)
    ax.set_ylabel("decode tokens/s (median of the rounds)")
    ax.set_title(f"speculative decoding: {model}" + (f", draft {draft}" if draft else ""),
                 fontsize=10)  # fmt: skip
    ax.legend(fontsize=8)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=120)
    plt.close(fig)
