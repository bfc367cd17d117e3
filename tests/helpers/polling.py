"""Waiting on another process (a daemon's metrics, log, trace or socket), which offers no
event to wait on: the one bounded poll the tests share."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import TypeVar

T = TypeVar("T")


def wait_until(ready: Callable[[], T], timeout: float, what: str, interval: float = 0.02) -> T:
    """Calls `ready` until it returns something truthy and returns that; fails the test
    with `what` once `timeout` seconds have passed."""
    deadline = time.monotonic() + timeout
    while True:
        value = ready()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"{what} (not within {timeout} s)")
        time.sleep(interval)  # poll: another process's state, bounded by the deadline
