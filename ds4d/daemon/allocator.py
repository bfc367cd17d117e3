"""glibc malloc settings for the long-running daemon: large blocks go back to the system.

glibc serves a request of at least M_MMAP_THRESHOLD bytes with its own mmap, unmapped
again by free. By default that threshold is dynamic: each time such a block is freed the
threshold rises to its size (up to 32 MiB), and later blocks below it come from the
heaps instead, where a freed block in the middle of a heap stays resident. The daemon
frees blocks of every size from kilobytes to tens of megabytes all the time (logits,
prefill workspaces, KV snapshots for checkpoints, request bodies), so with the dynamic
threshold its heaps grew by a staircase of freed-but-resident memory: a 25-minute soak
ended with 187 MiB free inside glibc's arenas against 124 MiB in use. A fixed threshold
(setting it turns the dynamic one off) keeps every large block an mmap of its own, and a
fixed trim threshold returns a heap's free top: RSS follows what is in use.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import logging

log = logging.getLogger("ds4d")

M_TRIM_THRESHOLD = -1  # glibc's mallopt parameter numbers (malloc.h)
M_MMAP_THRESHOLD = -3
MMAP_THRESHOLD_BYTES = 128 << 10  # glibc's own starting value, kept fixed
TRIM_THRESHOLD_BYTES = 128 << 10


def return_large_blocks() -> bool:
    """Fix glibc's mmap and trim thresholds for this process; False where there is no
    glibc mallopt (macOS, musl) or it refused, and nothing is changed."""
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
        mallopt = libc.mallopt
        libc.gnu_get_libc_version  # noqa: B018 - present in glibc only
    except (OSError, AttributeError):
        return False
    mallopt.argtypes = [ctypes.c_int, ctypes.c_int]
    mallopt.restype = ctypes.c_int
    ok = bool(mallopt(M_MMAP_THRESHOLD, MMAP_THRESHOLD_BYTES)) and bool(
        mallopt(M_TRIM_THRESHOLD, TRIM_THRESHOLD_BYTES)
    )
    if not ok:
        log.debug("mallopt refused the mmap/trim thresholds; glibc's defaults stay")
    return ok
