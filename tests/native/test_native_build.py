"""The native library builds warning-free with every installed compiler (gcc and clang, -Werror),
the build is loadable and exports the whole ds4n.h ABI, and a missing library is one clear error."""

from __future__ import annotations

import ctypes
import os
import re
import shutil
import subprocess
import sys
import sysconfig
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
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


def _ctypes_fields(struct: type[ctypes.Structure], path: str = "") -> list[tuple[str, int, int]]:
    """(C member path, offset, size) of every leaf field, nested structures flattened."""
    out = []
    for name, ctype, *_ in struct._fields_:
        field = getattr(struct, name)
        if isinstance(ctype, type) and issubclass(ctype, ctypes.Structure):
            out += [(f"{path}{name}.{sub}", field.offset + off, size)
                    for sub, off, size in _ctypes_fields(ctype)]  # fmt: skip
        else:
            out.append((f"{path}{name}", field.offset, field.size))
    return out


def test_hparams_mirrors_match_the_c_structs(tmp_path: Path) -> None:
    """Every family's ctypes HParamsC has the layout of its C ds4n_<prefix>_hparams: each
    member at the C offset with the C size, and the same total size (compiled with the
    headers, so a field added on one side only fails here rather than as wrong numbers)."""
    from ds4d.engine import gemma3, gptoss, llama, phi3, qwen3moe

    models = [llama.LlamaModel, phi3.Phi3Model, gemma3.Gemma3Model, qwen3moe.Qwen3MoEModel,
              gptoss.GptOssModel]  # fmt: skip
    cc = shutil.which("cc") or shutil.which("gcc") or shutil.which("clang")
    if cc is None:
        pytest.skip("no C compiler")
    lines = ["#include <stddef.h>", "#include <stdio.h>"]
    lines += [f'#include "{m.prefix}.h"' for m in models]
    lines.append("int main(void) {")
    expected = []
    for m in models:
        struct = sys.modules[m.__module__].HParamsC
        c_type = f"ds4n_{m.prefix}_hparams"
        lines.append(f'printf("%zu\\n", sizeof({c_type}));')
        expected.append(ctypes.sizeof(struct))
        for member, offset, size in _ctypes_fields(struct):
            lines.append(f'printf("%zu %zu\\n", offsetof({c_type}, {member}), '
                         f"sizeof((({c_type} *)0)->{member}));")  # fmt: skip
            expected.append(f"{offset} {size}")
    lines += ["return 0;", "}"]
    src, exe = tmp_path / "layout.c", tmp_path / "layout"
    src.write_text("\n".join(lines) + "\n")
    built = subprocess.run([cc, "-std=c11", f"-I{NATIVE}", str(src), "-o", str(exe)],
                           capture_output=True, text=True, timeout=60)  # fmt: skip
    assert built.returncode == 0, f"a ctypes field the C struct lacks?\n{built.stderr}"
    got = subprocess.run([str(exe)], capture_output=True, text=True, check=True).stdout.split("\n")
    assert got[:-1] == [str(e) for e in expected]
