"""The daemon's event loop never blocks: a trio Instrument times every task step of a real
daemon while it evicts 1 GB of checkpoints and writes another, and while /metrics, the
cache listing, the cache stats and the status are scraped over and over; no step may take
longer than 50 ms.

The daemon runs in this process (`ds4d.daemon.main.serve` in its own `trio.run`, so the
instrument sees its loop) with everything real: the embedded model, the disk cache on a
real directory, HTTP on a real socket, the admin socket, the live config. The gigabyte to
evict is sixteen 64 MiB checkpoint files written with kvfile for this model's fingerprint:
valid files the daemon indexes, budgets and deletes as any other (their payload is never
loaded: no prompt renders their text). The budget falls from 2 GiB to 64 MiB through
`config.set` while a request prefills a long prompt whose cold checkpoint is written.

A step's time is its wall time less the time the loop's thread waited for a CPU (Linux's
schedstat), so a machine loaded by other processes does not count as blocking, while
waiting on a lock, a disk or the GIL held by another thread of the daemon still does.
"""

from __future__ import annotations

import argparse
import os
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import pytest
import trio

from ds4d.daemon import admin_protocol
from ds4d.daemon.config import add_serve_arguments
from ds4d.daemon.control import ControlPlane
from ds4d.daemon.main import serve
from ds4d.daemon.notify import Notifier
from ds4d.daemon.reload import LiveConfig
from ds4d.state import kvfile
from tests.e2e.daemon_process import free_port, runtime_dir
from tests.polling import wait_until

LIMIT_S = 0.050
CTX = 2048
FILES, FILE_MIB = 16, 64  # the gigabyte to evict
BUDGET_BEFORE_MIB, BUDGET_AFTER_MIB = 2048, 64
MIB = 1024 * 1024


def _schedstat_path() -> str | None:
    path = "/proc/thread-self/schedstat"
    return path if os.path.exists(path) else None


@dataclass
class StepTimer(trio.abc.Instrument):
    """Times every task step of the loop it is installed on while `armed`."""

    armed: bool = False
    steps: int = 0
    slow: list[tuple[float, str]] = field(default_factory=list)  # (seconds, task name)
    longest: tuple[float, str] = (0.0, "")
    _fd: int | None = None
    _start: float = 0.0
    _waited: int = 0

    def before_run(self) -> None:
        path = _schedstat_path()  # opened on the loop's thread: its own counters
        self._fd = os.open(path, os.O_RDONLY) if path else None

    def after_run(self) -> None:
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None

    def _runqueue_ns(self) -> int:
        """Nanoseconds the loop's thread has spent runnable but waiting for a CPU."""
        if self._fd is None:
            return 0
        return int(os.pread(self._fd, 128, 0).split()[1])

    def before_task_step(self, task: trio.lowlevel.Task) -> None:
        self._waited = self._runqueue_ns()
        self._start = time.perf_counter()

    def after_task_step(self, task: trio.lowlevel.Task) -> None:
        took = time.perf_counter() - self._start
        took -= (self._runqueue_ns() - self._waited) / 1e9
        if not self.armed:
            return
        self.steps += 1
        if took > self.longest[0]:
            self.longest = (took, task.name)
        if took > LIMIT_S:
            self.slow.append((took, task.name))


def write_gigabyte(kv_dir: Path, fingerprint: str) -> None:
    """FILES checkpoints of FILE_MIB each for this daemon's model and KV type."""
    kv_dir.mkdir(mode=0o700)
    payload = bytes(FILE_MIB * MIB)
    digest = kvfile.fingerprint_digest(fingerprint)
    for i in range(FILES):
        kvfile.write_file(kv_dir, f"an older conversation, number {i}", payload,
                          reason=kvfile.Reason.COLD, tokens=1000, ctx=CTX,
                          fingerprint=digest)  # fmt: skip


@dataclass
class Scrapes:
    metrics: int = 0
    listings: int = 0
    stats: int = 0
    status: int = 0


def scrape_until(stop: threading.Event, url: str, socket: Path, counts: Scrapes) -> None:
    """/metrics, cache.ls, cache.stats and status, round after round, until `stop`."""
    with httpx.Client(timeout=30) as http:
        while not stop.is_set():
            assert "ds4d_kv_disk_bytes_used" in http.get(f"{url}/metrics").text
            counts.metrics += 1
            listing = admin_protocol.call(socket, "cache.ls")
            assert isinstance(listing, list)
            counts.listings += 1
            assert "bytes_used" in admin_protocol.call(socket, "cache.stats")
            counts.stats += 1
            assert admin_protocol.call(socket, "status")["loaded"]
            counts.status += 1


def in_thread(fn: Callable[[], Any]) -> tuple[threading.Thread, list[BaseException]]:
    errors: list[BaseException] = []

    def run() -> None:
        try:
            fn()
        except BaseException as e:  # noqa: BLE001 - handed to the test
            errors.append(e)

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    return thread, errors


@pytest.mark.slow
def test_no_loop_step_blocks_while_a_gigabyte_is_evicted_and_a_checkpoint_written(
    tmp_path: Path, engine, data_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("NOTIFY_SOCKET", raising=False)
    kv_dir = tmp_path / "kv"
    write_gigabyte(kv_dir, f"{engine.info.fingerprint}/kv-{engine.info.kv_type}")
    tok = engine.tokenizer
    words = (data_dir / "text" / "promessi_sposi.txt").read_text().split()
    prompt = " ".join(words[:1500])
    while len(tok.encode(prompt)) > 1200:  # room for the template and the reply
        prompt = prompt[: int(len(prompt) * 0.9)]
    port = free_port()
    runtime = runtime_dir(tmp_path)
    runtime.mkdir(mode=0o700, exist_ok=True)
    socket = runtime / "ds4d.sock"
    (tmp_path / "ds4d.toml").write_text("")
    parser = argparse.ArgumentParser()
    add_serve_arguments(parser)
    args = parser.parse_args([
        "--config", str(tmp_path / "ds4d.toml"),
        "--config-overrides", str(tmp_path / "overrides.toml"),
        "--host", "127.0.0.1", "--port", str(port), "--admin-socket", str(socket),
        "--ctx", str(CTX), "--slots", "2", "--kv-disk", "--kv-disk-dir", str(kv_dir),
        "--kv-disk-space-mb", str(BUDGET_BEFORE_MIB), "--kv-disk-write-budget", "0",
    ])  # fmt: skip
    notifier = Notifier()
    control = ControlPlane(LiveConfig.load(args, notifier=notifier), notifier)
    url = f"http://127.0.0.1:{port}"
    timer = StepTimer()
    counts = Scrapes()
    outcome: dict[str, Any] = {}

    def drive() -> None:
        def healthy() -> bool:
            try:
                return httpx.get(f"{url}/health", timeout=5).status_code == 200
            except httpx.TransportError:
                return False

        wait_until(healthy, 120, "the daemon did not load its model")
        before = admin_protocol.call(socket, "cache.stats")
        assert before["entries"] == FILES and before["bytes_used"] >= FILES * FILE_MIB * MIB
        timer.armed = True
        stop = threading.Event()
        scraper, scrape_errors = in_thread(lambda: scrape_until(stop, url, socket, counts))
        body = {"model": "m", "max_tokens": 8, "messages": [{"role": "user", "content": prompt}]}
        request, request_errors = in_thread(
            lambda: outcome.update(
                reply=httpx.post(f"{url}/v1/chat/completions", json=body, timeout=600)
            )
        )
        outcome["set"] = admin_protocol.call(
            socket, "config.set", {"key": "kv_disk_space_mb", "value": str(BUDGET_AFTER_MIB)}
        )

        def settled() -> dict[str, Any] | None:
            s = admin_protocol.call(socket, "cache.stats")
            done = (
                not request.is_alive()
                and s["files_written"] >= 1
                and s["pending_writes"] == 0
                and s["evictions"] >= FILES
                and s["bytes_used"] <= BUDGET_AFTER_MIB * MIB
            )
            return s if done else None

        outcome["after"] = wait_until(settled, 300, "the eviction and the new checkpoint")
        stop.set()
        scraper.join(60)
        timer.armed = False
        outcome["errors"] = scrape_errors + request_errors
        admin_protocol.call(socket, "stop")

    async def main() -> None:
        async with trio.open_nursery() as nursery:
            nursery.start_soon(serve, control.config, control)
            try:
                await trio.to_thread.run_sync(drive)
            except BaseException:
                nursery.cancel_scope.cancel()
                raise

    trio.run(main, instruments=[timer])

    assert not outcome["errors"], outcome["errors"]
    assert outcome["reply"].status_code == 200, outcome["reply"].text
    assert outcome["set"]["applied"] == ["kv_disk_space_mb"]
    after = outcome["after"]
    assert after["evicted_bytes"] >= FILES * FILE_MIB * MIB, after
    assert counts.metrics and counts.listings and counts.stats and counts.status, counts
    assert timer.steps > 100, timer.steps
    assert not timer.slow, (
        f"{len(timer.slow)} of {timer.steps} loop steps took over {LIMIT_S * 1000:.0f} ms: "
        + ", ".join(f"{name} {took * 1000:.0f} ms" for took, name in sorted(timer.slow)[-10:])
    )
    print(f"longest of {timer.steps} steps: {timer.longest[0] * 1000:.1f} ms in {timer.longest[1]}")
