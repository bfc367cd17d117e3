"""Start a real `ds4d serve` process for end-to-end tests: ephemeral port, private tmp
dirs, waits for /health 200, SIGTERM on teardown."""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

import httpx

from tests.polling import wait_until

LOAD_TIMEOUT_S = 120


def runtime_dir(tmp: Path) -> Path:
    """The daemon's XDG_RUNTIME_DIR for a test's `tmp`: short, because the admin socket
    inside it must fit a Unix socket path (about 100 bytes) and pytest's tmp paths under
    xdist do not; derived from `tmp` so a test can point ds4ctl at the same place."""
    return Path("/tmp") / f"ds4d-rt-{hashlib.sha1(str(tmp).encode()).hexdigest()[:12]}"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@dataclass
class Daemon:
    url: str
    proc: subprocess.Popen
    log_path: Path
    api_key: str | None = None
    health_seen: list[int] = field(default_factory=list)  # /health statuses while starting

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")

    def metrics(self) -> dict[str, float]:
        """The /metrics samples as {'name{labels}': value}."""
        headers = {"x-api-key": self.api_key} if self.api_key else {}
        text = httpx.get(f"{self.url}/metrics", headers=headers, timeout=10).text
        out = {}
        for line in text.splitlines():
            if line and not line.startswith("#"):
                key, _, value = line.rpartition(" ")
                out[key] = float(value)
        return out


@contextmanager
def running_daemon(tmp: Path, *args: str) -> Iterator[Daemon]:
    port = free_port()
    env = dict(os.environ)
    for var in ("XDG_CACHE_HOME", "XDG_CONFIG_HOME", "XDG_STATE_HOME"):
        d = tmp / var.lower()
        d.mkdir(mode=0o700, exist_ok=True)
        env[var] = str(d)
    runtime = runtime_dir(tmp)
    runtime.mkdir(mode=0o700, exist_ok=True)
    env["XDG_RUNTIME_DIR"] = str(runtime)
    env.pop("NOTIFY_SOCKET", None)
    log_path = tmp / "ds4d.log"
    cmd = [
        sys.executable,
        "-m",
        "ds4d",
        "serve",
        "--host",
        "127.0.0.1",
        "--port",
        str(port),
        "--no-kv-disk",
        *args,
    ]
    with open(log_path, "wb") as log:
        proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, env=env)
    key = args[args.index("--api-key") + 1] if "--api-key" in args else None
    daemon = Daemon(f"http://127.0.0.1:{port}", proc, log_path, key)
    try:

        def ready() -> bool:
            if proc.poll() is not None:
                raise RuntimeError(f"ds4d exited with {proc.returncode}:\n{daemon.log()}")
            try:
                daemon.health_seen.append(httpx.get(f"{daemon.url}/health", timeout=2).status_code)
            except httpx.TransportError:
                return False
            return daemon.health_seen[-1] == 200

        wait_until(ready, LOAD_TIMEOUT_S, "ds4d did not become healthy", interval=0.1)
        yield daemon
    finally:
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(timeout=20)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
        shutil.rmtree(runtime, ignore_errors=True)


def traces(path: Path) -> list[dict]:
    """The trace records written so far. Lines end at "\n" only: a record's JSON may hold
    U+2028 or NEL raw, which str.splitlines would also split on."""
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text().split("\n") if line]


def trace_of(path: Path, prompt_tokens: int, cached_tokens: int) -> dict:
    """The trace record of the request with this usage (written as the request ends, so
    it may land just after the response)."""

    def found() -> list[dict]:
        return [
            t
            for t in traces(path)
            if t["prompt_tokens"] == prompt_tokens and t["cached_tokens"] == cached_tokens
        ]

    return wait_until(found, 10, "no trace record for the request")[-1]


def check_usage(prompt: int, completion: int, total: int, max_tokens: int) -> None:
    assert prompt > 1 and 1 <= completion <= max_tokens and total == prompt + completion
