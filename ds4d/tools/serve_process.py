"""A `ds4d serve` of this interpreter as a child process, for what drives one from outside:
`ds4d bench serve --start`, the soak script, the end-to-end tests. It listens on a free
port of 127.0.0.1, runs with the environment the caller gives (`private_env`: its own XDG
directories, so its disk KV, config and admin socket are not the user's daemon's), writes
its output to a log file, is ready once /health answers 200, and is stopped with SIGTERM
(SIGKILL if it does not exit in time) when the `serve_process` block ends (or by `stop`,
for a caller that starts and kills daemons itself: `start_serve`).

Waiting for it to load is a bounded poll of /health (another process offers no event to
wait on). The caller may pass its own poll (`wait`): the tests pass tests/helpers/polling.py's
`wait_until`; tools take `poll_until` here. Plain http.client: no client library needed.
"""

from __future__ import annotations

import http.client
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

# What a `wait` is called with: (ready, timeout in seconds, what to say when it times out).
Wait = Callable[[Callable[[], bool], float, str], object]
XDG_DIRS = ("XDG_CACHE_HOME", "XDG_CONFIG_HOME", "XDG_STATE_HOME", "XDG_RUNTIME_DIR")
LOG_TAIL_LINES = 40


class ServeProcessError(RuntimeError):
    """The daemon exited before it was ready, or was not ready in time."""


def free_port() -> int:
    """A TCP port of 127.0.0.1 free right now."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def private_env(dirs: Mapping[str, Path], base: Mapping[str, str] | None = None) -> dict[str, str]:
    """`base` (default os.environ) with each XDG variable of `dirs` pointing at its
    directory (made, mode 0700) and no NOTIFY_SOCKET (the child must not notify the
    caller's service manager). The runtime directory holds the admin socket, whose path
    must fit a Unix socket address (about 100 bytes)."""
    env = dict(os.environ if base is None else base)
    for var, d in dirs.items():
        d.mkdir(mode=0o700, parents=True, exist_ok=True)
        env[var] = str(d)
    env.pop("NOTIFY_SOCKET", None)
    return env


def health_status(url: str, timeout: float = 5.0) -> int | None:
    """The status of GET {url}/health, or None when nothing answers."""
    host, _, port = url.removeprefix("http://").partition(":")
    conn = http.client.HTTPConnection(host, int(port), timeout=timeout)
    try:
        conn.request("GET", "/health")
        return conn.getresponse().status
    except (OSError, http.client.HTTPException):
        return None
    finally:
        conn.close()


def parse_metrics(text: str) -> dict[str, float]:
    """A /metrics page's samples as {'name{labels}': value}."""
    out = {}
    for line in text.splitlines():
        if line and not line.startswith("#"):
            key, _, value = line.rpartition(" ")
            out[key] = float(value)
    return out


def poll_until(ready: Callable[[], bool], timeout: float, what: str) -> None:
    """Calls `ready` until it is true; ServeProcessError(what) after `timeout` seconds."""
    deadline = time.monotonic() + timeout
    while not ready():
        if time.monotonic() > deadline:
            raise ServeProcessError(f"{what} (not within {timeout:.0f} s)")
        time.sleep(0.2)  # poll: another process loads the model, bounded by the deadline


@contextmanager
def sigterm_unwinds() -> Iterator[None]:
    """While the block runs (main thread), SIGTERM raises SystemExit(143) instead of ending
    the process at once (Python's default), so the blocks that stop its child servers run:
    a benchmark stopped by a timeout or a job manager leaves no server running."""

    def unwind(signum: int, frame: object) -> None:
        raise SystemExit(128 + signum)

    old = signal.signal(signal.SIGTERM, unwind)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, old)


@dataclass
class ServeProcess:
    url: str
    proc: subprocess.Popen[bytes]
    log_path: Path
    health_seen: list[int] = field(default_factory=list)  # /health statuses while starting

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")

    def ready(self) -> bool:
        """/health answers 200; ServeProcessError (with the log's tail) once the process
        has exited."""
        if self.proc.poll() is not None:
            tail = "\n".join(self.log().splitlines()[-LOG_TAIL_LINES:])
            raise ServeProcessError(f"ds4d serve exited with {self.proc.returncode}:\n{tail}")
        status = health_status(self.url, timeout=2.0)
        if status is not None:
            self.health_seen.append(status)
        return status == 200

    def stop(self, timeout: float) -> None:
        """SIGTERM, then SIGKILL after `timeout` seconds; nothing if it has exited."""
        if self.proc.poll() is not None:
            return
        self.proc.send_signal(signal.SIGTERM)
        try:
            self.proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()


DEFAULT_LAUNCHER = ("-m", "ds4d")


def serve_command(port: int, serve_args: Sequence[str],
                  launcher: Sequence[str] = DEFAULT_LAUNCHER, python: str | None = None) -> list[str]:  # fmt: skip
    """`launcher` follows the interpreter: `-m ds4d`, or a script that runs ds4d's CLI
    (the soak's memory probe). `python`: the interpreter, default this one (another
    checkout's venv runs that checkout's daemon)."""
    return [python or sys.executable, *launcher, "serve", "--host", "127.0.0.1",
            "--port", str(port), *serve_args]  # fmt: skip


def start_serve(
    serve_args: Sequence[str],
    *,
    env: Mapping[str, str],
    log_path: Path,
    start_timeout: float,
    wait: Wait = poll_until,
    echo: bool = False,
    append: bool = False,
    launcher: Sequence[str] = DEFAULT_LAUNCHER,
    python: str | None = None,
) -> ServeProcess:
    """`ds4d serve --host 127.0.0.1 --port <free port> *serve_args`, once ready; stopped
    (and ServeProcessError raised) if it is not. The caller stops it (`stop`). echo: print
    the command first; append: add to the log file rather than replace it."""
    port = free_port()
    cmd = serve_command(port, serve_args, launcher, python)
    if echo:
        print(f"# starting: {' '.join(cmd)}", flush=True)
    with open(log_path, "ab" if append else "wb") as log:
        try:
            proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, env=dict(env))
        except OSError as e:  # an interpreter that is not there
            raise ServeProcessError(f"cannot run {cmd[0]}: {e.strerror}") from None
    daemon = ServeProcess(f"http://127.0.0.1:{port}", proc, log_path)
    try:
        wait(daemon.ready, start_timeout, "ds4d serve did not become healthy")
    except BaseException:
        daemon.stop(timeout=10)
        raise
    return daemon


@contextmanager
def serve_process(
    serve_args: Sequence[str],
    *,
    env: Mapping[str, str],
    log_path: Path,
    start_timeout: float,
    stop_timeout: float = 30.0,
    wait: Wait = poll_until,
    echo: bool = False,
    launcher: Sequence[str] = DEFAULT_LAUNCHER,
    python: str | None = None,
) -> Iterator[ServeProcess]:
    """start_serve's daemon for the block, stopped at its end (SIGTERM, SIGKILL after
    stop_timeout seconds)."""
    daemon = start_serve(serve_args, env=env, log_path=log_path, start_timeout=start_timeout,
                         wait=wait, echo=echo, launcher=launcher, python=python)  # fmt: skip
    try:
        yield daemon
    finally:
        daemon.stop(stop_timeout)


@contextmanager
def private_daemon(serve_args: Sequence[str], *, start_timeout: float,
                   echo: bool = False, python: str | None = None) -> Iterator[str]:  # fmt: skip
    """serve_process's daemon with private XDG directories under a fresh temporary root
    (its disk KV starts cold; the user's own daemon and admin socket are left alone),
    removed after the block: yields its base URL. The root is short: the admin socket's
    path must fit a Unix socket address."""
    root = Path(tempfile.mkdtemp(prefix="ds4d-"))
    try:
        env = private_env({var: root / var.lower() for var in XDG_DIRS})
        with serve_process(serve_args, env=env, log_path=root / "ds4d.log",
                           start_timeout=start_timeout, echo=echo, python=python) as daemon:  # fmt: skip
            yield daemon.url
    finally:
        shutil.rmtree(root, ignore_errors=True)


@contextmanager
def other_server(cmd: Sequence[str], url: str, start_timeout: float,
                 env: Mapping[str, str] | None = None) -> Iterator[str]:  # fmt: skip
    """Another engine's HTTP server (llama-server, beside ds4d in a benchmark) from `cmd`
    (in `env`, default this process's), serving at `url`: yields the url once GET /health
    answers 200, stops it after. ServeProcessError, with the end of its output, if it
    exits or never becomes healthy."""
    log = tempfile.TemporaryFile()
    proc = subprocess.Popen(list(cmd), stdout=log, stderr=subprocess.STDOUT,
                            env=None if env is None else dict(env))  # fmt: skip

    def healthy() -> bool:
        if proc.poll() is not None:
            log.seek(0)
            raise ServeProcessError(f"{Path(cmd[0]).name} exited: {log.read()[-2000:]!r}")
        return health_status(url) == 200

    try:
        poll_until(healthy, start_timeout, f"{Path(cmd[0]).name} did not become healthy")
        yield url
    finally:
        proc.terminate()
        try:
            proc.wait(30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        log.close()
