"""The background checkpoint writer: one worker thread, a bounded queue.

Saving a slot's state used to write the file before the slot could be reused, and the
write counted in the next request's time to first token. Now the state layer copies the
session's payload (a memcpy on the engine thread) and queues a job here; the worker
writes it with the same atomicity as before. When the queue is full the job of lowest
value (the new one included) is dropped and counted: a dropped checkpoint only costs a
later prefill, a blocked queue would cost memory without bound.

The worker runs at a lower CPU priority than the engine (`nice` WRITER_NICE more, on
Linux, where a thread's nice value is its own): a checkpoint can wait, while a prefill it
competed with would be someone's time to first token, and a preempted engine thread
stalls its whole parallel step.

Thread-safe; jobs run one at a time in submission order.
"""

from __future__ import annotations

import logging
import os
import sys
import threading
from collections.abc import Callable
from dataclasses import dataclass, field

log = logging.getLogger("ds4d.kvcache")

DEFAULT_QUEUE = 4
# Added to the writer thread's nice value (Linux; capped at 19, the lowest priority): a
# saturated machine still gives it a little time, about 1.5 % of a core against an engine
# thread at nice 0, so it neither starves nor slows a prefill by more than that.
WRITER_NICE = 19

# How much a queued job is worth keeping (tuples compare in order; the lowest is dropped
# first): the state layer ranks a save by (likely reused, anchor, tokens).
JobValue = tuple[object, ...]


@dataclass(order=True)
class Job:
    value: JobValue  # the lowest is dropped first when the queue is full
    serial: int
    run: Callable[[], object] = field(compare=False)
    on_drop: Callable[[], object] = field(compare=False, default=lambda: None)
    nbytes: int = field(compare=False, default=0)  # memory the job holds until it is written


class CheckpointWriter:
    def __init__(self, max_pending: int = DEFAULT_QUEUE, name: str = "ds4d-kv-writer") -> None:
        if max_pending < 1:
            raise ValueError("the checkpoint queue needs room for at least one job")
        self.max_pending = max_pending
        self.dropped = 0
        self.failed = 0
        self._name = name
        self._jobs: list[Job] = []
        self._running = 0
        self._running_bytes = 0
        self._serial = 0
        self._closed = False
        self._cond = threading.Condition()
        self._thread: threading.Thread | None = None

    @property
    def pending(self) -> int:
        """Jobs queued or being written."""
        with self._cond:
            return len(self._jobs) + self._running

    @property
    def pending_bytes(self) -> int:
        """Memory held by jobs queued or being written (their `nbytes`): a snapshot stays
        resident until its file is written, so this is part of the process's RSS."""
        with self._cond:
            return sum(j.nbytes for j in self._jobs) + self._running_bytes

    def submit(self, run: Callable[[], object], value: JobValue = (),
               on_drop: Callable[[], object] = lambda: None, nbytes: int = 0) -> bool:  # fmt: skip
        """Queue `run`; False when it was dropped at once (queue full of more valuable
        jobs, or the writer closed). A queued job dropped later gets `on_drop()`. `nbytes`
        is the memory the job holds until it has run (reported by `pending_bytes`)."""
        with self._cond:
            if self._closed:
                self.dropped += 1
                on_drop()
                return False
            self._serial += 1
            job = Job(value, self._serial, run, on_drop, nbytes)
            self._jobs.append(job)
            victim = None
            if len(self._jobs) > self.max_pending:
                # lowest value, the newest among equals (older jobs are bases of newer)
                victim = min(self._jobs, key=lambda j: (j.value, -j.serial))
                self._jobs.remove(victim)
                self.dropped += 1
            if self._thread is None:
                self._thread = threading.Thread(target=self._loop, name=self._name, daemon=True)
                self._thread.start()
            self._cond.notify_all()
        if victim is not None:
            log.warning("kv cache: checkpoint queue full (%d): dropped a pending save",
                        self.max_pending)  # fmt: skip
            victim.on_drop()
        return victim is not job

    def _loop(self) -> None:
        lower_thread_priority(WRITER_NICE)
        while True:
            with self._cond:
                while not self._jobs and not self._closed:
                    self._cond.wait()
                if not self._jobs:
                    return
                job = self._jobs.pop(0)
                self._running = 1
                self._running_bytes = job.nbytes
            try:
                job.run()
            except Exception:  # noqa: BLE001 - a failed save must not stop the writer
                self.failed += 1
                log.exception("kv cache: background checkpoint write failed")
            finally:
                del job  # its snapshot is freed before the writer says it is idle
                with self._cond:
                    self._running = 0
                    self._running_bytes = 0
                    self._cond.notify_all()

    def drain(self, timeout: float | None = None) -> bool:
        """Wait until every queued job is written; False if `timeout` passed first."""
        with self._cond:
            return self._cond.wait_for(lambda: not self._jobs and not self._running, timeout)

    def close(self, timeout: float | None = None) -> bool:
        """Write what is queued (up to `timeout`), then stop the worker."""
        done = self.drain(timeout)
        with self._cond:
            self._closed = True
            self._cond.notify_all()
        return done


def lower_thread_priority(increment: int) -> bool:
    """Add `increment` to the calling thread's nice value; True if it was changed. Only on
    Linux, where setpriority on a thread id changes that thread alone (elsewhere it would
    change the whole process, the engine's threads included)."""
    if not sys.platform.startswith("linux"):
        return False
    tid = threading.get_native_id()
    try:
        os.setpriority(
            os.PRIO_PROCESS, tid, min(19, os.getpriority(os.PRIO_PROCESS, tid) + increment)
        )
    except OSError as e:  # a sandbox may refuse it: the writer still works
        log.debug("kv cache: could not lower the writer's priority: %s", e)
        return False
    return True
