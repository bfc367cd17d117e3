"""ds4d with memory probes, started by `scripts/ops/soak.py --probe` in place of `python -m ds4d`.

On SIGUSR1 the daemon writes probe-N.json into $DS4D_SOAK_PROBE_DIR: glibc's malloc
counters (mallinfo2: what C and large Python buffers hold, in the heap and in mmapped
chunks), Python's gc-tracked objects counted by type, and with $DS4D_SOAK_TRACEMALLOC=N
(frames) the tracemalloc total and a snapshot (snapshot-N.pickle) that the soak diffs
between the warm-up and the end. The handler runs on the daemon's main thread between
bytecodes (trio wakes for the signal), so a probe pauses serving for its duration.

    python scripts/ops/soak_probe.py serve --port ... (the arguments of `ds4d serve`)
"""

from __future__ import annotations

import ctypes
import ctypes.util
import gc
import json
import os
import signal
import sys
import time
import tracemalloc
from collections import Counter
from pathlib import Path
from types import FrameType

MALLINFO2_FIELDS = ("arena", "ordblks", "smblks", "hblks", "hblkhd", "usmblks", "fsmblks",
                    "uordblks", "fordblks", "keepcost")  # fmt: skip


class _Mallinfo2(ctypes.Structure):
    _fields_ = [(name, ctypes.c_size_t) for name in MALLINFO2_FIELDS]


def mallinfo2() -> dict[str, int] | None:
    """glibc's allocator counters over all arenas; None off glibc (or before 2.33)."""
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
        fn = libc.mallinfo2
    except (OSError, AttributeError):
        return None
    fn.restype = _Mallinfo2
    info = fn()
    return {name: int(getattr(info, name)) for name in MALLINFO2_FIELDS}


def probe(out: Path, n: int) -> dict[str, object]:
    t0 = time.monotonic()
    gc.collect()
    types = Counter(type(o).__name__ for o in gc.get_objects())
    result: dict[str, object] = {
        "n": n,
        "mallinfo2": mallinfo2(),
        "gc_objects": sum(types.values()),
        "gc_types": dict(types.most_common(60)),
    }
    if tracemalloc.is_tracing():
        current, peak = tracemalloc.get_traced_memory()
        result["tracemalloc_current"] = current
        result["tracemalloc_peak"] = peak
        snap = out / f"snapshot-{n}.pickle"
        tracemalloc.take_snapshot().dump(str(snap))
        result["snapshot"] = str(snap)
    result["probe_seconds"] = round(time.monotonic() - t0, 3)
    return result


def install(out: Path) -> None:
    count = [0]

    def on_signal(signum: int, frame: FrameType | None) -> None:
        count[0] += 1
        n = count[0]
        data = probe(out, n)
        tmp = out / f"probe-{n}.json.tmp"
        tmp.write_text(json.dumps(data))
        tmp.rename(out / f"probe-{n}.json")  # the soak waits for the finished file

    signal.signal(signal.SIGUSR1, on_signal)


def main() -> int:
    out = Path(os.environ["DS4D_SOAK_PROBE_DIR"])
    out.mkdir(parents=True, exist_ok=True)
    frames = int(os.environ.get("DS4D_SOAK_TRACEMALLOC", "0"))
    if frames > 0:
        tracemalloc.start(frames)
    install(out)
    from ds4d.cli.main import main as ds4d_main

    return ds4d_main(sys.argv[1:])


if __name__ == "__main__":
    sys.exit(main())
