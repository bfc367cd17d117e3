"""The native library builds warning-free with every installed compiler (gcc and clang, -Werror),
the build is loadable and exports the whole ds4n.h ABI, and a missing library is one clear error."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
NATIVE = REPO / "native"

SMOKE = """
import numpy as np
from ds4d.engine import native
rng = np.random.default_rng(0)
W = rng.standard_normal((5, 64)).astype(np.float32)
X = rng.standard_normal((3, 64)).astype(np.float32)
with native.Pool(2) as pool:
    Y = native.matmul(pool, "F32", W.view(np.uint8), 5, 64, X)
assert np.allclose(Y, X @ W.T, rtol=1e-5, atol=1e-5)
print("ok", native.SIMD_NAMES[native.simd_level()])
"""


def abi_symbols() -> set[str]:
    header = (NATIVE / "ds4n.h").read_text()
    return set(re.findall(r"\b(ds4n_[a-z0-9_]+)\s*\(", header))


@pytest.mark.parametrize("cc", ["gcc", "clang"])
def test_library_builds_without_warnings(cc: str, tmp_path: Path) -> None:
    if shutil.which(cc) is None:
        pytest.skip(f"{cc} not installed")
    build = tmp_path / "build"
    env = dict(os.environ, CFLAGS="-O2 -Werror")
    proc = subprocess.run(
        ["make", "-s", "-j2", "-C", str(NATIVE), f"CC={cc}", f"BUILD={build}"],
        env=env, capture_output=True, text=True, timeout=240,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "warning" not in (proc.stdout + proc.stderr).lower()
    lib = build / "libds4n.so"
    exported = subprocess.run(["nm", "-D", "--defined-only", str(lib)], capture_output=True,
                              text=True, check=True).stdout  # fmt: skip
    missing = {s for s in abi_symbols() if not re.search(rf"\bT {s}$", exported, re.M)}
    assert not missing, f"ds4n.h symbols not exported: {sorted(missing)}"
    smoke = subprocess.run([sys.executable, "-c", SMOKE], env=dict(os.environ, DS4D_NATIVE_LIB=str(lib)),
                           capture_output=True, text=True, cwd=REPO, timeout=60)  # fmt: skip
    assert smoke.stdout.startswith("ok"), smoke.stderr


def test_missing_library_is_one_clear_error(tmp_path: Path) -> None:
    code = (
        "try:\n    import ds4d.engine.native\n"
        "except Exception as e:\n    print(type(e).__name__, e)\n"
    )
    env = dict(os.environ, DS4D_NATIVE_LIB=str(tmp_path / "nope.so"))
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True)
    assert out.stdout.strip() == "EngineError native library not built: run `make native`", (
        out.stderr
    )
