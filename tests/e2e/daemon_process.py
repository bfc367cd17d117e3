"""Start a real `ds4d serve` process for end-to-end tests (ds4d.tools.serve_process): ephemeral
port, private tmp dirs, waits for /health 200, SIGTERM on teardown."""

from __future__ import annotations

import functools
import hashlib
import json
import shutil
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import httpx

from ds4d.tools.serve_process import (
    ServeProcess,
    free_port,
    parse_metrics,
    private_env,
    serve_process,
)
from tests.helpers.polling import wait_until

__all__ = [
    "Daemon",
    "check_usage",
    "free_port",
    "running_daemon",
    "runtime_dir",
    "trace_of",
    "traces",
]

LOAD_TIMEOUT_S = 120


def runtime_dir(tmp: Path) -> Path:
    """The daemon's XDG_RUNTIME_DIR for a test's `tmp`: short, because the admin socket
    inside it must fit a Unix socket path (about 100 bytes) and pytest's tmp paths under
    xdist do not; derived from `tmp` so a test can point ds4ctl at the same place."""
    return Path("/tmp") / f"ds4d-rt-{hashlib.sha1(str(tmp).encode()).hexdigest()[:12]}"


@dataclass
class Daemon(ServeProcess):
    api_key: str | None = None

    def metrics(self) -> dict[str, float]:
        """The /metrics samples as {'name{labels}': value}."""
        headers = {"x-api-key": self.api_key} if self.api_key else {}
        return parse_metrics(httpx.get(f"{self.url}/metrics", headers=headers, timeout=10).text)


@contextmanager
def running_daemon(tmp: Path, *args: str) -> Iterator[Daemon]:
    dirs = {var: tmp / var.lower() for var in ("XDG_CACHE_HOME", "XDG_CONFIG_HOME",
                                                "XDG_STATE_HOME")}  # fmt: skip
    runtime = dirs["XDG_RUNTIME_DIR"] = runtime_dir(tmp)
    wait = functools.partial(wait_until, interval=0.1)
    try:
        with serve_process(["--no-kv-disk", *args], env=private_env(dirs),
                           log_path=tmp / "ds4d.log", start_timeout=LOAD_TIMEOUT_S,
                           stop_timeout=20, wait=wait) as p:  # fmt: skip
            key = args[args.index("--api-key") + 1] if "--api-key" in args else None
            yield Daemon(p.url, p.proc, p.log_path, p.health_seen, key)
    finally:
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
