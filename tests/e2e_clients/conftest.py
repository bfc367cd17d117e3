"""The real agent clients (Claude Code, Codex CLI, opencode) run against a real ds4d.

`make e2e-clients` installs the pinned clients from npm (scripts/setup/install-e2e-clients.sh)
and runs this directory with DS4D_E2E_CLIENTS=1; without it nothing here is collected, so
`make test` / `make test-all` never need npm, the network or minutes of prefill.

Each client file starts its own daemon in the configuration of docs/clients.md (the embedded
SmolLM2, `--ctx 32768 --rope-scaling yarn`, two slots, disk KV on) with a trace of every
request (text included), runs the client non-interactively, offline against loopback,
with its own HOME, and reads what happened from the client's own output and the daemon's
trace.
A run's numbers (first-turn prompt tokens, time to first token, the next run's cached
tokens) are printed at the end of the session."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from tests.e2e.daemon_process import Daemon, running_daemon, runtime_dir, traces
from tests.helpers.polling import wait_until

if not os.environ.get("DS4D_E2E_CLIENTS"):
    collect_ignore_glob = ["test_*.py"]

REPO = Path(__file__).resolve().parents[2]
CLIENTS_DIR = Path(os.environ.get("DS4D_CLIENTS_DIR") or Path.home() / ".cache" / "ds4d-clients")
# What scripts/setup/install-e2e-clients.sh installs: {command: its prefix under CLIENTS_DIR}.
PINNED = {"claude": "claude-2.1.197", "codex": "codex-0.171.0", "opencode": "opencode-1.18.33"}
# A whole client run: Claude Code's full first prompt (~20k tokens) prefills at a few
# hundred tokens/s on two cores, far slower when the machine is shared.
RUN_TIMEOUT_S = float(os.environ.get("DS4D_E2E_RUN_TIMEOUT_S", "2400"))
# Answers are kept short through each client's own output limit or ds4d's default cap:
# a 135M model given 32000 tokens rambles for minutes. 256 rather than less: Claude Code
# answers a reply cut at the limit (stop_reason max_tokens) by asking the model to resume,
# three times, and then fails the run; SmolLM2 ends most of its replies within 256.
MAX_OUTPUT = 256

REPORT: list[dict] = []


def client_bin(name: str) -> Path:
    path = CLIENTS_DIR / PINNED[name] / "node_modules" / ".bin" / name
    if not path.exists():
        pytest.fail(f"{path} is missing: run `make e2e-clients` (it installs the clients)")
    return path


@dataclass
class Served:
    """A daemon for one client, with what the suite needs around it."""

    daemon: Daemon
    tmp: Path
    trace_path: Path
    seen: int = 0  # trace records already handed out by `new_records`

    @property
    def url(self) -> str:
        return self.daemon.url

    @property
    def port(self) -> int:
        return int(self.daemon.url.rsplit(":", 1)[1])

    def new_records(self) -> list[dict]:
        """Trace records written since the last call (one per finished request)."""
        records = traces(self.trace_path)
        fresh, self.seen = records[self.seen :], len(records)
        return fresh

    def force_tool_choice(self, value: str) -> None:
        """Set the live `force_tool_choice` key through the admin socket (ds4ctl)."""
        env = dict(
            os.environ,
            XDG_RUNTIME_DIR=str(runtime_dir(self.tmp)),
            XDG_STATE_HOME=str(self.tmp / "xdg_state_home"),
            XDG_CONFIG_HOME=str(self.tmp / "xdg_config_home"),
        )
        code = "import sys; from ds4ctl.cli import main; sys.exit(main(sys.argv[1:]))"
        p = subprocess.run(
            [sys.executable, "-c", code, "config", "set", "force_tool_choice", value],
            env=env,
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert p.returncode == 0, f"ds4ctl exit {p.returncode}: {p.stderr.strip()}"


@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Served]:
    tmp = tmp_path_factory.mktemp("ds4d")
    trace = tmp / "trace.jsonl"
    with running_daemon(
        tmp,
        "--ctx",
        "32768",
        "--rope-scaling",
        "yarn",
        "--kv-disk",
        "--trace",
        str(trace),
        "--trace-content",
        "--max-tokens",
        str(MAX_OUTPUT),
    ) as d:
        yield Served(d, tmp, trace)
        sys.stdout.write("")  # the daemon's log stays in tmp for a failed run


@dataclass
class Run:
    argv: list[str]
    returncode: int
    stdout: str
    stderr: str
    seconds: float
    records: list[dict] = field(default_factory=list)  # ds4d's trace of its requests

    def explain(self) -> str:
        return (
            f"{' '.join(self.argv[:3])}... exit {self.returncode} after "
            f"{self.seconds:.0f}s\nstdout:\n{self.stdout[-3000:]}\n"
            f"stderr:\n{self.stderr[-3000:]}"
        )


def run_client(served: Served, argv: list[str], env: dict[str, str], cwd: Path) -> Run:
    served.new_records()  # what earlier runs left is not this run's
    t0 = time.monotonic()
    p = subprocess.run(
        argv,
        env=env,
        cwd=cwd,
        stdin=subprocess.DEVNULL,
        capture_output=True,
        text=True,
        timeout=RUN_TIMEOUT_S,
    )
    run = Run(argv, p.returncode, p.stdout, p.stderr, time.monotonic() - t0)

    def settled() -> bool:
        # A request's trace record is written just after it is counted as finished,
        # which can be after the client has read its answer and exited.
        m = served.daemon.metrics()
        finished = sum(v for k, v in m.items() if k.startswith("ds4d_requests_finished_total"))
        return m["ds4d_requests_running"] == 0 and len(traces(served.trace_path)) >= finished

    wait_until(settled, 30, "the daemon's requests did not settle after the client exited")
    run.records = served.new_records()
    return run


def base_env(home: Path) -> dict[str, str]:
    """A clean environment: the client's own HOME and XDG dirs, no proxies, no keys."""
    keep = ("PATH", "LANG", "LC_ALL", "TERM", "TMPDIR", "USER", "LOGNAME", "SHELL")
    env = {k: os.environ[k] for k in keep if k in os.environ}
    home.mkdir(parents=True, exist_ok=True)
    env.update(
        HOME=str(home),
        XDG_CONFIG_HOME=str(home / ".config"),
        XDG_CACHE_HOME=str(home / ".cache"),
        XDG_DATA_HOME=str(home / ".local/share"),
        XDG_STATE_HOME=str(home / ".local/state"),
        NO_COLOR="1",
        CI="1",
    )
    return env


def main_request(records: list[dict], api: str) -> dict:
    """The run's request with the largest prompt: the agent's own turn, not a side
    request (titles, summaries)."""
    mine = [r for r in records if r["api"] == api]
    assert mine, f"no {api} request reached ds4d: {[r['api'] for r in records]}"
    return max(mine, key=lambda r: r["prompt_tokens"])


def report(client: str, first: dict, second: dict, seconds: float) -> None:
    REPORT.append(
        {
            "client": client,
            "prompt": first["prompt_tokens"],
            "ttft": first.get("ttft_s"),
            "second_prompt": second["prompt_tokens"],
            "second_cached": second["cached_tokens"],
            "run_s": seconds,
        }
    )


# The embedded model's tool markup (ds4d's Hermes block): a client never sees it as text.
TOOL_MARKUP = ("<tool_call>", "</tool_call>", "<tool_response>", "</tool_response>")


def assert_no_markup(texts: list[str], run: Run) -> None:
    """None of the text a client reports (its own output of the model's replies) holds
    tool markup."""
    for text in texts:
        for marker in TOOL_MARKUP:
            assert marker not in text, (marker, text, run.explain())


def assert_reused(first: dict, second: dict) -> None:
    """The second run's main request reused most of its prompt from the first's KV."""
    assert second["cached_tokens"] > 0, second
    assert second["cached_tokens"] >= 0.5 * second["prompt_tokens"], second
    assert second["cache_source"] != "none", second
    assert first["prompt_tokens"] > 0


def tool_round_trip(records: list[dict], api: str, tool: str) -> tuple[dict, dict]:
    """The request whose answer called `tool`, and the one carrying the result: the
    next whose prompt continues the call's (a side request, such as opencode's title,
    may come between); it reuses the call's whole prompt."""
    mine = [r for r in records if r["api"] == api]
    calls = [
        n
        for n, r in enumerate(mine)
        if r["finish_reason"] == "tool_calls" and f" {tool}] " in (r.get("output") or "")
    ]
    assert calls, f"no {tool} call in {[(r['finish_reason'], r.get('output')) for r in mine]}"
    call = mine[calls[0]]
    later = [r for r in mine[calls[0] + 1 :] if r["prompt"].startswith(call["prompt"])]
    assert later, "the client never sent the tool's result back"
    after = later[0]
    assert after["cached_tokens"] >= call["prompt_tokens"], (call, after)
    return call, after


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter) -> None:
    if not REPORT:
        return
    w = terminalreporter
    w.section("agent clients against ds4d (embedded SmolLM2, --ctx 32768 --rope-scaling yarn)")
    w.write_line(
        f"{'client':<22} {'1st prompt':>10} {'TTFT s':>8} {'2nd prompt':>10} "
        f"{'2nd cached':>10} {'run s':>7}"
    )
    for r in REPORT:
        ttft = f"{r['ttft']:.1f}" if r["ttft"] is not None else "-"
        w.write_line(
            f"{r['client']:<22} {r['prompt']:>10} {ttft:>8} {r['second_prompt']:>10} "
            f"{r['second_cached']:>10} {r['run_s']:>7.0f}"
        )
