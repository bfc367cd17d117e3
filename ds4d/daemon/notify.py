"""sd_notify(3) for systemd's Type=notify, through `sdnotify`. No-ops without NOTIFY_SOCKET.

READY=1 is sent only once the model is loaded and every listener is bound; STATUS= tells
`systemctl status` what the daemon is doing; WATCHDOG=1 comes from a task on the trio loop
itself, every half WATCHDOG_USEC, so a wedged event loop stops the pings and systemd
restarts it (a side thread would keep pinging a dead loop).
"""

from __future__ import annotations

import os
import time
from collections.abc import Mapping

import sdnotify
import trio


class Notifier:
    """Reads NOTIFY_SOCKET, WATCHDOG_USEC and WATCHDOG_PID from the environment."""

    def __init__(self) -> None:
        env = os.environ
        self.enabled = bool(env.get("NOTIFY_SOCKET"))
        self._notifier = sdnotify.SystemdNotifier() if self.enabled else None
        if self._notifier is not None and self._notifier.socket is not None:
            # Never block the event loop on a receiver that does not read: a full queue
            # drops the message (sdnotify ignores send errors) instead.
            self._notifier.socket.setblocking(False)
        self._watchdog_usec = _watchdog_usec(env)
        self._ready = False

    def send(self, *lines: str) -> None:
        if self._notifier is not None:
            self._notifier.notify("\n".join(lines))

    def status(self, text: str) -> None:
        self.send(f"STATUS={text}")

    def ready(self, status: str | None = None) -> None:
        self._ready = True
        self.send("READY=1", *([f"STATUS={status}"] if status else []))

    def reloading(self) -> None:
        if self._ready:
            self.send(
                "RELOADING=1",
                f"MONOTONIC_USEC={time.clock_gettime_ns(time.CLOCK_MONOTONIC) // 1000}",
            )

    def reloaded(self) -> None:
        if self._ready:
            self.send("READY=1")

    def stopping(self, status: str = "stopping") -> None:
        self.send("STOPPING=1", f"STATUS={status}")

    def extend_timeout(self, seconds: float) -> None:
        """Ask for `seconds` more before systemd's start/stop timeout kills us."""
        self.send(f"EXTEND_TIMEOUT_USEC={int(seconds * 1_000_000)}")

    def watchdog(self) -> None:
        self.send("WATCHDOG=1")

    @property
    def watchdog_interval(self) -> float | None:
        """Seconds between WATCHDOG=1 pings (half the timeout), or None when not asked."""
        if self._watchdog_usec is None or self._notifier is None:
            return None
        return self._watchdog_usec / 2 / 1_000_000


def _watchdog_usec(env: Mapping[str, str]) -> int | None:
    try:
        usec = int(env.get("WATCHDOG_USEC", ""))
    except ValueError:
        return None
    pid = env.get("WATCHDOG_PID")
    if usec <= 0 or (pid and pid != str(os.getpid())):
        return None
    return usec


async def run_watchdog(
    notifier: Notifier, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED
) -> None:
    """Ping the watchdog from the trio loop until cancelled (returns at once if unused)."""
    task_status.started()
    interval = notifier.watchdog_interval
    if interval is None:
        return
    while True:
        notifier.watchdog()
        await trio.sleep(interval)
