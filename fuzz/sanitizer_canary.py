"""Checks that the sanitizer setup of `make check-sanitize` really reports: a child python
with the same environment hands libds4n a deliberately short buffer, and ASan must name
the overflow and stop the child; the loaded library must also carry the UBSan runtime.
Exit status 0 only if both hold, so a run where the preload or the sanitized library got
lost fails instead of passing silently."""

from __future__ import annotations

import subprocess
import sys

CHILD = """
import numpy as np
from pathlib import Path
import ds4d.engine.native as n
maps = Path('/proc/self/maps').read_text()
print('asan' if 'asan' in maps else 'no-asan', 'ubsan' if 'ubsan' in maps else 'no-ubsan',
      n.library_path(), flush=True)
raw = np.zeros(10, np.uint8)  # a Q4_0 block of 32 values is 18 bytes
out = np.zeros(32, np.float32)
n.lib.ds4n_dequantize(n.Q4_0, raw.ctypes.data, out.ctypes.data_as(n.c_float_p), 32)
print('returned', flush=True)
"""


def main() -> int:
    r = subprocess.run([sys.executable, "-c", CHILD], capture_output=True, text=True, timeout=120)
    first = r.stdout.splitlines()[0] if r.stdout else ""
    ok = (
        first.startswith("asan ubsan ")
        and "build-san" in first
        and "AddressSanitizer: heap-buffer-overflow" in r.stderr
        and "returned" not in r.stdout
        and r.returncode != 0
    )
    if not ok:
        print(f"sanitizer canary: not reported (exit {r.returncode}, {first!r})", file=sys.stderr)
        print(r.stderr[-2000:], file=sys.stderr)
        return 1
    print(f"sanitizer canary: overflow reported, libds4n {first.split()[2]}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
