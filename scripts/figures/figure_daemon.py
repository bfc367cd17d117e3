"""What the serving figure scripts share: a real `ds4d serve` on an ephemeral port with
private cache, state and runtime directories, its /metrics, the load average, and a
streamed chat completion timed token by token.

Not a test helper: the figure scripts print seconds measured on the machine they run on,
so each line they print carries the load average beside it."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

import httpx

from ds4d.tools.serve_process import (
    XDG_DIRS,
    ServeProcessError,
    parse_metrics,
    private_env,
    serve_process,
)

# A figure's daemon loads the embedded model; at shutdown it may still write a checkpoint.
START_TIMEOUT_S = 600.0
STOP_TIMEOUT_S = 60.0


@dataclass
class Daemon:
    url: str
    proc: subprocess.Popen[bytes]
    home: Path  # its XDG directories and log

    def metrics(self) -> dict[str, float]:
        """The /metrics samples as {'name{labels}': value}."""
        return parse_metrics(httpx.get(f"{self.url}/metrics", timeout=30).text)

    def cpu_seconds(self) -> float:
        """CPU time the daemon's process has used, all its threads (Linux /proc): less
        sensitive to other load than wall time."""
        fields = Path(f"/proc/{self.proc.pid}/stat").read_text().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")

    def ds4ctl(self, *args: str) -> object:
        """The JSON answer of the real ds4ctl (the one installed beside this python)."""
        env = dict(os.environ, XDG_RUNTIME_DIR=str(self.home / "xdg_runtime_dir"))
        tool = Path(sys.executable).parent / "ds4ctl"
        out = subprocess.run([str(tool), "--json", *args], env=env, capture_output=True,
                             text=True, check=True)  # fmt: skip
        return json.loads(out.stdout)

    def idle_writer(self) -> dict[str, float]:
        """The metrics once no checkpoint write is queued or running."""
        while True:
            m = self.metrics()
            if not m.get("ds4d_kv_disk_pending_writes", 0):
                return m
            time.sleep(0.1)  # polling another process's writer

    def log(self) -> str:
        return (self.home / "ds4d.log").read_text(errors="replace")


@contextmanager
def started(*args: str) -> Iterator[Daemon]:
    """`ds4d serve ARGS` until the block ends (SIGTERM, then its exit is waited for), started
    by the shared helper (ds4d.tools.serve_process) with private XDG directories and its
    log in the daemon's private directory; `{home}` in an argument is that directory."""
    with tempfile.TemporaryDirectory(prefix="ds4d-fig-") as tmp:
        home = Path(tmp)
        env = private_env({var: home / var.lower() for var in XDG_DIRS})
        own = [a.replace("{home}", str(home)) for a in args]
        try:
            with serve_process(own, env=env, log_path=home / "ds4d.log",
                               start_timeout=START_TIMEOUT_S,
                               stop_timeout=STOP_TIMEOUT_S) as child:  # fmt: skip
                yield Daemon(child.url, child.proc, home)
        except ServeProcessError as e:
            raise SystemExit(str(e)) from None


def load() -> str:
    """The 1-minute load average, as the figures are printed beside."""
    return f"{os.getloadavg()[0]:.2f}"


@dataclass
class Timed:
    """One streamed chat completion: when it was sent, when each text chunk arrived."""

    sent: float
    chunks: list[float] = field(default_factory=list)
    usage: dict[str, int] = field(default_factory=dict)
    ended: float = 0.0

    @property
    def ttft(self) -> float:
        return self.chunks[0] - self.sent if self.chunks else float("nan")

    @property
    def total(self) -> float:
        return self.ended - self.sent


def stream_chat(url: str, content: str, max_tokens: int, timeout: float = 900) -> Timed:
    """A greedy streamed chat completion of one user message, timed chunk by chunk."""
    body = {
        "model": "m",
        "messages": [{"role": "user", "content": content}],
        "max_tokens": max_tokens,
        "temperature": 0,
        "stream": True,
        "stream_options": {"include_usage": True},
    }
    timed = Timed(time.perf_counter())
    with httpx.stream("POST", f"{url}/v1/chat/completions", json=body, timeout=timeout) as r:
        r.raise_for_status()
        for line in r.iter_lines():
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            event = json.loads(line[6:])
            if event.get("usage"):
                timed.usage = event["usage"]
            for choice in event.get("choices", []):
                if choice.get("delta", {}).get("content"):
                    timed.chunks.append(time.perf_counter())
    timed.ended = time.perf_counter()
    return timed


def passage(words: int, offset: int) -> str:
    """`words` words of the checkout's test text from word `offset` on (wrapping): distinct
    offsets give prompts that share nothing past the chat template."""
    text = (Path(__file__).resolve().parents[2] / "tests/data/text/promessi_sposi.txt").read_text()
    all_words = text.split()
    start = offset % len(all_words)
    picked = (all_words[start:] + all_words)[:words]
    return " ".join(picked)


def split_serve_flags(argv: list[str]) -> tuple[list[str], list[str]]:
    """A figure script's own arguments, and the ds4d serve flags after `--`."""
    if "--" not in argv:
        return argv, []
    i = argv.index("--")
    return argv[:i], argv[i + 1 :]
