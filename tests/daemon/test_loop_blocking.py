"""The daemon's event loop never blocks: a trio Instrument times every task step of a real
daemon while it evicts 1 GB of checkpoints and writes another, and while /metrics, the
cache listing, the cache stats and the status are scraped over and over; no step may take
longer than 50 ms.

The daemon is `ds4d serve` run by tests/helpers/loop_probe.py (the same config, control plane and
`ds4d.daemon.main.serve`, with the instrument on its loop) in its own process, with
everything real: the embedded model, the disk cache on a real directory, HTTP on a real
socket, the admin socket, the live config. The gigabyte to evict is sixteen 64 MiB
checkpoint files written with kvfile for this model's fingerprint: valid files the daemon
indexes, budgets and deletes as any other (their payload is never loaded: no prompt
renders their text). The budget falls from 2 GiB to 64 MiB through `config.set` while a
request prefills a long prompt whose checkpoints are written.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest

from ds4d.daemon import admin_protocol
from ds4d.state import kvfile
from tests.e2e.daemon_process import free_port, runtime_dir
from tests.helpers.loop_probe import LIMIT_S
from tests.helpers.polling import wait_until

REPO = Path(__file__).resolve().parents[2]
CTX = 2048
FILES, FILE_MIB = 16, 64  # the gigabyte to evict
BUDGET_BEFORE_MIB, BUDGET_AFTER_MIB = 2048, 64
MIB = 1024 * 1024


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
    tmp_path: Path, engine, data_dir: Path
) -> None:
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
    config = tmp_path / "ds4d.toml"
    # in the config file, not on the command line: `config.set` overrides the file only
    config.write_text(f"kv_disk_space_mb = {BUDGET_BEFORE_MIB}\nkv_disk_write_budget = 0\n")
    report = tmp_path / "steps.json"
    cmd = [
        sys.executable, "-m", "tests.helpers.loop_probe", str(report),
        "--config", str(config), "--config-overrides", str(tmp_path / "overrides.toml"),
        "--host", "127.0.0.1", "--port", str(port), "--admin-socket", str(socket),
        "--ctx", str(CTX), "--slots", "2", "--kv-disk", "--kv-disk-dir", str(kv_dir),
    ]  # fmt: skip
    env = {k: v for k, v in os.environ.items() if k != "NOTIFY_SOCKET"}
    env["PYTHONPATH"] = str(REPO)
    log = tmp_path / "ds4d.log"
    url = f"http://127.0.0.1:{port}"
    counts = Scrapes()
    with open(log, "wb") as out:
        proc = subprocess.Popen(cmd, cwd=REPO, env=env, stdout=out, stderr=subprocess.STDOUT)
    try:

        def healthy() -> bool:
            if proc.poll() is not None:
                raise AssertionError(f"the daemon exited:\n{log.read_text()}")
            try:
                return httpx.get(f"{url}/health", timeout=5).status_code == 200
            except httpx.TransportError:
                return False

        wait_until(healthy, 120, "the daemon did not load its model")
        before = admin_protocol.call(socket, "cache.stats")
        assert before["entries"] == FILES and before["bytes_used"] >= FILES * FILE_MIB * MIB
        proc.send_signal(signal.SIGUSR1)  # timing on
        stop = threading.Event()
        scraper, scrape_errors = in_thread(lambda: scrape_until(stop, url, socket, counts))
        body = {"model": "m", "max_tokens": 8, "messages": [{"role": "user", "content": prompt}]}
        replies: list[httpx.Response] = []
        request, request_errors = in_thread(
            lambda: replies.append(httpx.post(f"{url}/v1/chat/completions", json=body, timeout=600))
        )
        changed = admin_protocol.call(
            socket, "config.set", {"key": "kv_disk_space_mb", "value": str(BUDGET_AFTER_MIB)}
        )
        assert changed["value"] == BUDGET_AFTER_MIB, changed

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

        after = wait_until(settled, 300, "the eviction and the new checkpoint")
        stop.set()
        scraper.join(60)
        proc.send_signal(signal.SIGUSR2)  # timing off
        admin_protocol.call(socket, "stop")
        assert proc.wait(120) == 0, log.read_text()
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()

    assert not scrape_errors + request_errors, scrape_errors + request_errors
    assert replies[0].status_code == 200, replies[0].text
    assert after["evicted_bytes"] >= FILES * FILE_MIB * MIB, after
    assert counts.metrics and counts.listings and counts.stats and counts.status, counts
    steps = json.loads(report.read_text())
    assert steps["steps"] > 100, steps
    assert not steps["slow"], (
        f"{len(steps['slow'])} of {steps['steps']} loop steps took over "
        f"{LIMIT_S * 1000:.0f} ms:\n"
        + "\n".join(
            f"{s['task']} {s['s'] * 1000:.0f} ms, during it:\n{s['stack']}"
            for s in sorted(steps["slow"], key=lambda s: s["s"])[-5:]
        )
    )
    print(
        f"longest of {steps['steps']} steps: {steps['longest_s'] * 1000:.1f} ms"
        f" in {steps['longest_task']}; scrapes: {counts}"
    )
