"""sd_notify: the Notifier against a real NOTIFY_SOCKET, and the watchdog task's period.

The end-to-end "test plays systemd" check against a real ds4d process lives in
tests/ds4ctl/test_control_plane.py, beside the other acceptance tests that share one daemon."""

from __future__ import annotations

import os
import socket
import tempfile
import threading
from pathlib import Path

import pytest
import trio
from trio.testing import MockClock

from ds4d.daemon.notify import Notifier, run_watchdog


@pytest.fixture
def notify_socket():
    directory = Path(tempfile.mkdtemp(prefix="ds4n"))
    path = directory / "notify"
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    sock.bind(str(path))
    sock.settimeout(2)
    yield path, sock
    sock.close()
    path.unlink()
    directory.rmdir()


def received(sock: socket.socket) -> list[str]:
    out = []
    sock.setblocking(False)
    try:
        while True:
            out.append(sock.recv(4096).decode())
    except BlockingIOError:
        pass
    finally:
        sock.settimeout(2)
    return out


def notifier(monkeypatch, **env: str) -> Notifier:
    for name in ("NOTIFY_SOCKET", "WATCHDOG_USEC", "WATCHDOG_PID"):
        monkeypatch.delenv(name, raising=False)
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    return Notifier()


def test_messages_reach_the_socket(notify_socket, monkeypatch):
    path, sock = notify_socket
    n = notifier(monkeypatch, NOTIFY_SOCKET=str(path))
    n.reloading()  # before READY=1 a reload is not announced
    n.status("loading model")
    n.ready(status="serving")
    n.reloading()
    n.reloaded()
    n.extend_timeout(12.5)
    n.stopping()
    messages = received(sock)
    assert messages[0] == "STATUS=loading model"
    assert messages[1] == "READY=1\nSTATUS=serving"
    assert messages[2].startswith("RELOADING=1\nMONOTONIC_USEC=")
    assert messages[3:] == [
        "READY=1",
        "EXTEND_TIMEOUT_USEC=12500000",
        "STOPPING=1\nSTATUS=stopping",
    ]


def test_silent_without_notify_socket(monkeypatch):
    n = notifier(monkeypatch, WATCHDOG_USEC="1000000")
    assert not n.enabled and n.watchdog_interval is None
    n.ready()  # no socket: nothing to send, nothing raised


def test_watchdog_interval_is_half_the_timeout(notify_socket, monkeypatch):
    path, _ = notify_socket
    env = {"NOTIFY_SOCKET": str(path), "WATCHDOG_USEC": "3000000"}
    assert notifier(monkeypatch, **env).watchdog_interval == 1.5
    pid = str(os.getpid())
    assert notifier(monkeypatch, **env, WATCHDOG_PID=pid).watchdog_interval == 1.5
    assert notifier(monkeypatch, **env, WATCHDOG_PID="1").watchdog_interval is None
    env["WATCHDOG_USEC"] = "junk"
    assert notifier(monkeypatch, **env).watchdog_interval is None


def test_watchdog_task_pings_at_its_period(notify_socket, monkeypatch):
    path, sock = notify_socket
    n = notifier(monkeypatch, NOTIFY_SOCKET=str(path), WATCHDOG_USEC="200000")

    async def main() -> None:
        async with trio.open_nursery() as nursery:
            await nursery.start(run_watchdog, n)
            await trio.sleep(0.55)  # virtual time (MockClock below)
            nursery.cancel_scope.cancel()

    trio.run(main, clock=MockClock(autojump_threshold=0))  # virtual time: exact periods
    pings = received(sock)
    assert pings == ["WATCHDOG=1"] * 6  # at 0, 0.1, ... 0.5 s


def test_a_receiver_that_does_not_read_never_blocks_the_sender(notify_socket, monkeypatch):
    """The watchdog runs on the event loop: a full queue must drop, not block."""
    path, _ = notify_socket
    n = notifier(monkeypatch, NOTIFY_SOCKET=str(path))

    sender = threading.Thread(target=lambda: [n.watchdog() for _ in range(1000)], daemon=True)
    sender.start()
    sender.join(5)
    assert not sender.is_alive(), "sending blocked on a full notify socket"
