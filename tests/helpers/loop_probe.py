"""`ds4d serve` with a trio Instrument timing every task step of its event loop:

    python -m tests.helpers.loop_probe REPORT.json [serve options]

runs the daemon exactly as `ds4d serve` does (config from every source, logging, the
control plane, `ds4d.daemon.main.serve`), in its own process so that only the daemon's
own threads share its interpreter. SIGUSR1 starts the timing, SIGUSR2 stops it; when the
daemon exits, REPORT.json gets the count of steps timed, the longest, and every step over
LIMIT_S with the task's name and the loop thread's stack sampled while it ran.

A step's time is its wall time less the time the loop's thread waited for a CPU (Linux's
schedstat), so other processes loading the machine do not count as blocking, while
waiting on a lock, a disk or the GIL held by another thread of the daemon still does.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import sys
import threading
import time
import traceback
from dataclasses import dataclass, field
from pathlib import Path

import trio

from ds4d.daemon.config import add_serve_arguments
from ds4d.daemon.control import ControlPlane
from ds4d.daemon.main import serve

LIMIT_S = 0.050
SCHEDSTAT = "/proc/thread-self/schedstat"


@dataclass(eq=False)  # hashable by identity: trio keeps its instruments in a dict
class StepTimer(trio.abc.Instrument):
    """Times every task step while `armed`. A watcher thread samples the loop thread's
    stack once a step has run for half the limit, so a slow step is reported with what it
    was doing."""

    armed: bool = False
    steps: int = 0
    slow: list[tuple[float, str, str]] = field(default_factory=list)  # (s, task, stack)
    longest: tuple[float, str] = (0.0, "")
    _fd: int | None = None
    _start: float = 0.0
    _waited: int = 0
    _serial: int = 0  # of the step running, 0 between steps
    _next: int = 0
    _sampled: dict[int, str] = field(default_factory=dict)  # step serial -> its stack
    _stop: threading.Event = field(default_factory=threading.Event)

    def before_run(self) -> None:
        # opened on the loop's thread: its own counters
        self._fd = os.open(SCHEDSTAT, os.O_RDONLY) if os.path.exists(SCHEDSTAT) else None
        loop = threading.get_ident()
        threading.Thread(target=self._watch, args=(loop,), daemon=True).start()

    def after_run(self) -> None:
        self._stop.set()
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None

    def _watch(self, loop: int) -> None:
        while not self._stop.wait(LIMIT_S / 10):
            serial, start = self._serial, self._start
            if not serial or serial in self._sampled:
                continue
            if time.perf_counter() - start > LIMIT_S / 2:
                frame = sys._current_frames().get(loop)
                if frame is not None and self._serial == serial:
                    self._sampled[serial] = "".join(traceback.format_stack(frame)[-14:])

    def _runqueue_ns(self) -> int:
        """Nanoseconds the loop's thread has spent runnable but waiting for a CPU."""
        if self._fd is None:
            return 0
        return int(os.pread(self._fd, 128, 0).split()[1])

    def before_task_step(self, task: trio.lowlevel.Task) -> None:
        self._waited = self._runqueue_ns()
        self._next += 1
        self._serial = self._next
        self._start = time.perf_counter()

    def after_task_step(self, task: trio.lowlevel.Task) -> None:
        took = time.perf_counter() - self._start
        took -= (self._runqueue_ns() - self._waited) / 1e9
        serial, self._serial = self._serial, 0
        stack = self._sampled.pop(serial, "")
        if not self.armed:
            return
        self.steps += 1
        if took > self.longest[0]:
            self.longest = (took, task.name)
        if took > LIMIT_S:
            self.slow.append((took, task.name, stack))

    def report(self) -> dict[str, object]:
        return {
            "steps": self.steps,
            "longest_s": self.longest[0],
            "longest_task": self.longest[1],
            "slow": [{"s": s, "task": name, "stack": stack} for s, name, stack in self.slow],
        }


def main(argv: list[str]) -> int:
    report = Path(argv[0])
    parser = argparse.ArgumentParser(prog="loop_probe")
    add_serve_arguments(parser)
    control = ControlPlane.from_args(parser.parse_args(argv[1:]))
    timer = StepTimer()

    def arm(armed: bool) -> None:
        timer.armed = armed

    signal.signal(signal.SIGUSR1, lambda *_: arm(True))
    signal.signal(signal.SIGUSR2, lambda *_: arm(False))
    try:
        return trio.run(serve, control.config, control, instruments=[timer])
    finally:
        report.write_text(json.dumps(timer.report()))


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
