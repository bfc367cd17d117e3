"""Several clients at once: each call on a thread of its own, all released together."""

from __future__ import annotations

import threading
from collections.abc import Callable, Sequence
from typing import TypeVar

T = TypeVar("T")


def run_together(calls: Sequence[Callable[[], T]], timeout: float = 300) -> list[T]:
    """Each call on its own thread, released at once by a barrier (so the daemon sees them
    concurrently); their results in order. A failure in any is raised once all have ended."""
    results: list[T | None] = [None] * len(calls)
    failures: list[BaseException] = []
    start = threading.Barrier(len(calls))

    def run(i: int) -> None:
        try:
            start.wait(30)
            results[i] = calls[i]()
        except BaseException as e:  # reported below, on the test's thread
            failures.append(e)

    threads = [threading.Thread(target=run, args=(i,)) for i in range(len(calls))]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout)
    if failures:
        raise failures[0]
    assert not any(t.is_alive() for t in threads), "a client did not finish in time"
    return results  # type: ignore[return-value]  # every call returned
