"""`make -C native check-neon` as a test, so it runs beside the others on a test worker
rather than alone before them: this machine's SIMD kernels (quants, matmul, attention,
SwiGLU/GeGLU) against the scalar ones, natively against libds4n.so, and the NEON ones
cross-compiled for aarch64 and run under qemu-user (native/check-neon.mk)."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

NATIVE = Path(__file__).resolve().parent.parent / "native"


def test_simd_kernels_match_scalar_here_and_neon_under_qemu() -> None:
    proc = subprocess.run(
        ["make", "-C", str(NATIVE), "check-neon", f"PYTHON={sys.executable}"],
        capture_output=True,
        text=True,
        timeout=600,
    )
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, out
    # This machine's own set (avx2 on x86-64, neon on arm64), against the library.
    assert re.search(r"check_kernels: \w+ vs scalar, \d+ types: ok", out), out
    if "check-neon: skipped" in out:  # outside CI only: in CI the target fails instead
        pytest.skip("needs aarch64-linux-gnu-gcc and qemu-aarch64")
    assert re.search(r"check_kernels: neon vs scalar, \d+ types: ok", out), out
    # The attention check, natively and under qemu.
    assert out.count("SIMD vs scalar: max |diff|") == 2, out
