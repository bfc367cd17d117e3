"""The admin socket: permissions, peer check, stale sockets, protocol errors, commands.

The server runs for real (trio, a real Unix socket, real client connections) with the
real LiveConfig and disk cache; only the daemon's slot view is a small stand-in, since
the scheduler is not what these tests are about (tests/ds4ctl/test_control_plane.py covers the daemon).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import socket
import stat
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import trio

from ds4d.daemon import admin
from ds4d.daemon.admin import AdminCommands, AdminError, SocketInUseError, bind_socket, call
from ds4d.daemon.config import add_serve_arguments
from ds4d.daemon.reload import LiveConfig


class StandInDaemon:
    def __init__(self) -> None:
        self.stopped = False

    def status(self) -> dict[str, Any]:
        return {"model": "test", "uptime_s": 1.5, "slots": {"total": 2, "busy": 0}}

    def slots(self) -> list[dict[str, Any]]:
        return [{"id": 0, "state": "idle", "tokens": 0}, {"id": 1, "state": "idle", "tokens": 7}]

    async def stop(self) -> None:
        self.stopped = True

    def decode_batching(self) -> None:
        return None


def make_live(tmp_path: Path) -> LiveConfig:
    parser = argparse.ArgumentParser()
    add_serve_arguments(parser)
    env = {
        "HOME": str(tmp_path),
        "XDG_CONFIG_HOME": str(tmp_path / "cfg"),
        "XDG_STATE_HOME": str(tmp_path / "state"),
    }
    return LiveConfig.load(parser.parse_args([]), env)


@contextlib.contextmanager
def running_server(
    path: Path, commands: AdminCommands, allowed: frozenset[int] | None = None
) -> Iterator[list[str]]:
    """Serve `path` on a trio loop in a background thread; yields the server's log."""
    logged: list[str] = []
    ready = threading.Event()
    box: dict[str, Any] = {}

    async def main() -> None:
        box["token"] = trio.lowlevel.current_trio_token()
        box["stop"] = trio.Event()
        async with trio.open_nursery() as nursery:
            await nursery.start(
                lambda task_status: admin.serve(
                    path, commands, allowed_uids=allowed, log=logged.append, task_status=task_status
                )
            )
            ready.set()
            await box["stop"].wait()
            nursery.cancel_scope.cancel()

    def run() -> None:
        try:
            trio.run(main)
        except BaseException as e:  # surfaced to the test below
            box["error"] = e
            ready.set()

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    ready.wait(10)
    if "error" in box:
        raise box["error"]
    try:
        yield logged
    finally:
        trio.from_thread.run_sync(box["stop"].set, trio_token=box["token"])
        thread.join(10)


@pytest.fixture
def sock_path(tmp_path: Path) -> Path:
    # Unix socket paths are limited to ~100 bytes; pytest's tmp paths can be long.
    import tempfile

    short = Path(tempfile.mkdtemp(prefix="ds4a"))
    yield short / "ds4d" / "ds4d.sock"
    import shutil

    shutil.rmtree(short, ignore_errors=True)


def raw_exchange(path: Path, payload: bytes) -> list[dict[str, Any]]:
    """Send raw bytes, read every reply line until the server closes or goes quiet."""
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as s:
        s.settimeout(5)
        s.connect(str(path))
        s.sendall(payload)
        s.shutdown(socket.SHUT_WR)
        data = b""
        while chunk := s.recv(65536):
            data += chunk
    return [json.loads(line) for line in data.splitlines()]


def test_socket_and_directory_are_private_and_removed_on_exit(tmp_path, sock_path):
    commands = AdminCommands(StandInDaemon(), make_live(tmp_path))
    with running_server(sock_path, commands):
        st = sock_path.lstat()
        assert stat.S_ISSOCK(st.st_mode)
        assert stat.S_IMODE(st.st_mode) == 0o600
        assert stat.S_IMODE(sock_path.parent.stat().st_mode) == 0o700
        assert call(sock_path, "status")["model"] == "test"
    assert not sock_path.exists()


def test_peer_with_another_uid_is_refused(tmp_path, sock_path):
    commands = AdminCommands(StandInDaemon(), make_live(tmp_path))
    someone_else = frozenset({os.geteuid() + 4242})
    with running_server(sock_path, commands, allowed=someone_else) as logged:
        with pytest.raises(AdminError, match=f"peer uid {os.geteuid()} is not allowed") as e:
            call(sock_path, "status")
        assert e.value.code == "forbidden"
    assert any("refused connection" in line for line in logged)


def test_peer_uid_is_read_from_the_kernel():
    a, b = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
    with a, b:
        assert admin.peer_uid(a) == os.geteuid()


@pytest.mark.skipif(os.geteuid() != 0, reason="needs root to connect as another uid")
def test_real_process_of_another_user_is_refused(tmp_path, sock_path):
    """With the file permissions opened up, the uid check alone must stop a stranger."""
    commands = AdminCommands(StandInDaemon(), make_live(tmp_path))
    with running_server(sock_path, commands):
        os.chmod(sock_path.parent.parent, 0o755)
        os.chmod(sock_path.parent, 0o755)
        os.chmod(sock_path, 0o666)
        read, write = os.pipe()
        pid = os.fork()
        if pid == 0:  # child: become nobody, try the socket, report the reply
            try:
                os.close(read)
                os.setgid(65534)
                os.setuid(65534)
                try:
                    call(sock_path, "status")
                    out = b"accepted"
                except AdminError as e:
                    out = f"{e.code}: {e}".encode()
                except BaseException as e:
                    out = repr(e).encode()
                os.write(write, out)
            finally:
                os._exit(0)
        os.close(write)
        with os.fdopen(read, "rb") as fh:
            reply = fh.read().decode()
        os.waitpid(pid, 0)
    assert reply == "forbidden: peer uid 65534 is not allowed"


def test_stale_socket_is_replaced_but_a_live_one_or_a_file_is_not(tmp_path, sock_path):
    sock_path.parent.mkdir(mode=0o700)
    dead = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    dead.bind(str(sock_path))
    dead.close()  # the file stays, nobody listens: a crashed daemon's leftover
    live_sock = bind_socket(sock_path)
    try:
        assert stat.S_IMODE(sock_path.lstat().st_mode) == 0o600
        with pytest.raises(SocketInUseError, match="another ds4d is listening"):
            bind_socket(sock_path)
    finally:
        live_sock.close()
    sock_path.unlink()
    sock_path.write_text("not a socket")
    with pytest.raises(SocketInUseError, match="is not a socket"):
        bind_socket(sock_path)
    assert sock_path.read_text() == "not a socket"


def test_protocol_errors_keep_the_connection_usable(tmp_path, sock_path):
    daemon = StandInDaemon()
    commands = AdminCommands(daemon, make_live(tmp_path))
    lines = [
        b"{not json",
        json.dumps({"v": 2, "cmd": "status"}).encode(),
        json.dumps({"v": 1, "cmd": "fly"}).encode(),
        json.dumps({"v": 1, "cmd": "power", "args": {"level": 0}}).encode(),
        json.dumps({"v": 1, "cmd": "power", "args": {"watts": 3}}).encode(),
        json.dumps({"v": 1, "cmd": "cache.ls"}).encode(),
        json.dumps({"v": 1, "cmd": "power", "args": {"level": 30}}).encode(),
        b"",
        json.dumps({"v": 1, "cmd": "stop"}).encode(),
    ]
    with running_server(sock_path, commands):
        replies = raw_exchange(sock_path, b"\n".join(lines) + b"\n")
    codes = [r["error"]["code"] if not r["ok"] else "ok" for r in replies]
    assert codes == [
        "bad_request",
        "unsupported_version",
        "unknown_command",
        "bad_request",
        "bad_request",
        "unavailable",
        "ok",
        "ok",
    ]
    assert all(r["v"] == 1 for r in replies)
    assert replies[6]["result"] == {"power": 30}
    assert daemon.stopped


def test_commands_reach_live_config_and_disk_cache(tmp_path, sock_path):
    from ds4d.state.diskcache import DiskCache

    cache = DiskCache(tmp_path / "kv", budget_bytes=1 << 20, fingerprint=b"test", ctx=4096)
    live = make_live(tmp_path)
    powers: list[int] = []
    live.subscribe(lambda c, changed: "power" in changed and powers.append(c.power))
    commands = AdminCommands(StandInDaemon(), live, cache)
    trace = tmp_path / "trace.jsonl"
    with running_server(sock_path, commands):
        status = call(sock_path, "status")
        assert status["power"] == 100 and status["trace"] is None
        assert status["cache"]["entries"] == 0
        assert call(sock_path, "slots")[1]["tokens"] == 7
        assert call(sock_path, "cache.ls") == []
        assert call(sock_path, "cache.evict", {"all": True}) == {"evicted": 0, "names": []}
        assert call(sock_path, "power", {"level": 55}) == {"power": 55}
        assert powers == [55] and live.current.power == 55
        assert call(sock_path, "trace.on", {"path": str(trace)})["path"] == str(trace)
        assert live.current.trace == str(trace)
        assert call(sock_path, "trace.off")["enabled"] is False
        assert call(sock_path, "config.get", {"key": "power"})["values"] == {"power": 55}
        with pytest.raises(AdminError, match="cache evict needs"):
            call(sock_path, "cache.evict")
