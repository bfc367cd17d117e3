"""The native library builds warning-free with every installed compiler (gcc and clang, -Werror),
the build is loadable and exports the whole ds4n.h ABI, and a missing library is one clear error."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import sysconfig
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
        ["make", "-s", "-j2", "-C", str(NATIVE), f"CC={cc}", f"BUILD={build}",
         f"PYTHON={sys.executable}"],
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
    missing = tmp_path / "nope.so"
    env = dict(os.environ, DS4D_NATIVE_LIB=str(missing))
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True)
    assert (
        out.stdout.strip() == f"EngineError native library {missing} (DS4D_NATIVE_LIB) not found"
    ), out.stderr


def test_installed_package_finds_its_library_as_package_data(tmp_path: Path) -> None:
    """Outside a checkout (as in site-packages) the library is ds4d/lib/libds4n.so inside
    the package, found through importlib.resources; without it, one line saying so."""
    site = tmp_path / "site"
    shutil.copytree(REPO / "ds4d", site / "ds4d", ignore=shutil.ignore_patterns("__pycache__"))
    env = {k: v for k, v in os.environ.items() if k != "DS4D_NATIVE_LIB"}
    # -S with the environment's site-packages on PYTHONPATH: numpy and the rest are found,
    # but no .pth runs, so an editable install of ds4d cannot shadow the copy.
    paths = sysconfig.get_paths()
    env["PYTHONPATH"] = os.pathsep.join([str(site), paths["purelib"], paths["platlib"]])
    code = (
        "import ds4d\n"
        "try:\n    from ds4d.engine import native\n"
        "except Exception as e:\n    print(type(e).__name__, e)\n"
    )
    run = dict(env=env, capture_output=True, text=True, cwd=tmp_path, timeout=60)
    out = subprocess.run([sys.executable, "-S", "-c", code], **run)
    packaged = site / "ds4d" / "lib" / "libds4n.so"
    assert out.stdout.strip() == (
        f"EngineError native library {packaged} is missing from the ds4d package: reinstall ds4d"
    ), out.stderr
    packaged.parent.mkdir()
    shutil.copyfile(NATIVE / "build" / "libds4n.so", packaged)
    smoke = subprocess.run(
        [sys.executable, "-S", "-c", SMOKE + "print(native.library_path())"], **run
    )
    assert smoke.stdout.startswith("ok"), smoke.stderr
    assert smoke.stdout.splitlines()[-1] == str(packaged)
