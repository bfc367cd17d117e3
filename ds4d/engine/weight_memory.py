"""Where a model's weights live while it runs: the file's page-cache mapping or a resident copy.

Decode streams every weight once per token, so the weights' page size matters. The file's
mapping (`mmap`) is made of 4 KB pages: every 4 KB of weights is a TLB miss, which on a
virtual machine is a two-level page walk, and the hardware prefetcher restarts at each page.
A resident copy (`huge`) is read from the file at load into anonymous memory advised for
2 MB transparent huge pages (Linux's MADV_HUGEPAGE; THP in `madvise` or `always` mode),
512 times fewer pages to walk. On the 2-core KVM development machine a plain two-thread read
of a 96 MB buffer ran at 27-30 GB/s on huge pages against 7-12 GB/s on 4 KB pages.

What the copy costs: the weights' size in the process's RSS (the page cache's copy of the
file stays reclaimable, shared with anyone else mapping it) and one read of the file at load
(a fraction of a second for a small model from the page cache, disk speed when it is cold).
`auto`, the default, makes the copy only for a model that is small next to the machine's
memory (at most a quarter of the RAM and half of what is available now), so a model of
DeepSeek V4's size always stays mapped. Where huge pages cannot be had (another OS, THP
disabled) the copy is still correct, only no faster, so `auto` then keeps the mapping.
"""

from __future__ import annotations

import mmap
import sys
from pathlib import Path

import numpy as np

WEIGHT_MODES = ("auto", "mmap", "huge")
HUGE_PAGE = 2 << 20
_READ_CHUNK = 64 << 20
_THP_SETTING = Path("/sys/kernel/mm/transparent_hugepage/enabled")
_MEMINFO = Path("/proc/meminfo")


def huge_pages_available() -> bool:
    """Whether this process can get transparent huge pages by asking (madvise)."""
    if not sys.platform.startswith("linux") or not hasattr(mmap, "MADV_HUGEPAGE"):
        return False
    try:
        setting = _THP_SETTING.read_text()
    except OSError:
        return False
    return "[never]" not in setting


def _meminfo() -> dict[str, int]:
    """/proc/meminfo in bytes (empty where there is none)."""
    out: dict[str, int] = {}
    try:
        for line in _MEMINFO.read_text().splitlines():
            key, _, rest = line.partition(":")
            fields = rest.split()
            if fields and fields[0].isdigit():
                out[key] = int(fields[0]) * (1024 if fields[1:] == ["kB"] else 1)
    except OSError:
        pass
    return out


def resolve(mode: str, n_bytes: int) -> str:
    """The mode to use ("mmap" or "huge") for `n_bytes` of weights; ValueError for an
    unknown mode."""
    if mode not in WEIGHT_MODES:
        raise ValueError(f"unknown weight memory {mode!r} (known: {', '.join(WEIGHT_MODES)})")
    if mode != "auto":
        return mode
    if not huge_pages_available():
        return "mmap"
    info = _meminfo()
    total, available = info.get("MemTotal", 0), info.get("MemAvailable", 0)
    small = n_bytes <= total // 4 and n_bytes <= available // 2
    return "huge" if small else "mmap"


def read_resident(path: Path, offset: int, n_bytes: int) -> np.ndarray:
    """Bytes [offset, offset + n_bytes) of the file in fresh anonymous memory, starting on a
    2 MB boundary and advised for huge pages before it is first touched; OSError if the
    file cannot be read or is shorter. The array keeps its mapping alive."""
    # Private: an anonymous shared mapping would be shmem, under shmem's own THP setting.
    region = mmap.mmap(-1, n_bytes + HUGE_PAGE, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
    whole = np.frombuffer(region, dtype=np.uint8)
    start = -whole.ctypes.data % HUGE_PAGE  # mmap gives 4 KB alignment; THP wants 2 MB
    data = whole[start : start + n_bytes]
    if hasattr(mmap, "MADV_HUGEPAGE"):
        try:
            region.madvise(mmap.MADV_HUGEPAGE, start, n_bytes - n_bytes % mmap.PAGESIZE)
        except OSError:
            pass  # no THP here: still a correct copy, on small pages
    view = memoryview(region)[start : start + n_bytes]
    with open(path, "rb") as f:
        f.seek(offset)
        done = 0
        while done < n_bytes:
            got = f.readinto(view[done : min(done + _READ_CHUNK, n_bytes)])
            if not got:
                raise OSError(f"file ended {n_bytes - done} bytes early")
            done += got
    view.release()
    return data
