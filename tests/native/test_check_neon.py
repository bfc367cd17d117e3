"""`make -C native check-neon` as a test, so it runs beside the others on a test worker
rather than alone before them: this machine's SIMD kernels (quants, matmul, attention,
SwiGLU/GeGLU; every level the CPU runs) against the scalar ones, natively against
libds4n.so, and the NEON ones
cross-compiled for aarch64 and run under qemu-user (native/check-neon.mk)."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

from ds4d.engine import native
from tests.native.test_kernels import SIMD_LEVELS

NATIVE = Path(__file__).resolve().parents[2] / "native"


def test_simd_kernels_match_scalar_here_and_neon_under_qemu() -> None:
    proc = subprocess.run(
        ["make", "-C", str(NATIVE), "check-neon", f"PYTHON={sys.executable}"],
        capture_output=True,
        text=True,
        timeout=600,
    )
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, out
    # This machine's own sets (every x86 level the CPU runs, neon on arm64), against the
    # library, none left out: the quant kernels of each, the attention of each but AMX's
    # (it runs the AVX-512 attention).
    here = [lvl for lvl in SIMD_LEVELS if lvl != native.SIMD_NEON]
    for lvl in here or [native.SIMD_NEON]:
        name = native.SIMD_NAMES[lvl]
        assert re.search(rf"check_kernels: {name} vs scalar, \d+ types: ok", out), out
        if lvl != native.SIMD_AMX:
            assert f"{name} attention (scalar also vs the definition)" in out, out
    attention_here = len([lvl for lvl in here if lvl != native.SIMD_AMX]) or 1
    if "check-neon: skipped" in out:  # outside CI only: in CI the target fails instead
        pytest.skip("needs aarch64-linux-gnu-gcc and qemu-aarch64")
    assert re.search(r"check_kernels: neon vs scalar, \d+ types: ok", out), out
    # Under qemu, a CPU with SDOT and one without: both integer kernel sets compared.
    assert "check_kernels: neon: integer kernels neon+dotprod" in out, out
    assert "check_kernels: neon: integer kernels neon\n" in out, out
    # The attention check, natively (each set) and under qemu.
    assert out.count("SIMD vs scalar: max |diff|") == attention_here + 1, out
