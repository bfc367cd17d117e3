"""Service units: rendered with real paths by `ds4d install-service`, checked by
systemd-analyze (the real one) and plistlib."""

from __future__ import annotations

import configparser
import os
import plistlib
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from ds4d.daemon import exitcodes

DS4D = Path(sys.executable).parent / "ds4d"
needs_analyze = pytest.mark.skipif(
    shutil.which("systemd-analyze") is None,
    reason="systemd-analyze not installed (make test-tools)",
)


def install(kind: str, dest: Path, *extra: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [str(DS4D), "install-service", f"--{kind}", "--dest", str(dest), *extra],
        capture_output=True,
        text=True,
        timeout=60,
    )


def verify(unit: Path, user: bool, tmp_path: Path) -> str:
    """systemd-analyze's complaints about `unit` ('' when it is clean)."""
    env = dict(os.environ)
    cmd = ["systemd-analyze", "verify", "--man=no", str(unit)]
    if user:
        runtime = tmp_path / "runtime"
        runtime.mkdir(mode=0o700, exist_ok=True)
        env["XDG_RUNTIME_DIR"] = str(runtime)
        cmd.insert(1, "--user")
    done = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=60)
    return (done.stdout + done.stderr).strip() + (
        "" if done.returncode == 0 else f"\nexit status {done.returncode}"
    )


def service_section(path: Path) -> configparser.SectionProxy:
    parser = configparser.ConfigParser(strict=False, interpolation=None)
    parser.optionxform = str  # keep directive case
    parser.read(path)
    return parser["Service"]


@needs_analyze
@pytest.mark.parametrize("kind", ["system", "user"])
def test_systemd_units_render_and_verify(kind, tmp_path):
    done = install(kind, tmp_path)
    assert done.returncode == 0, done.stderr
    unit = tmp_path / "ds4d.service"
    assert "@" not in unit.read_text().replace("$MAINPID", "")
    assert verify(unit, kind == "user", tmp_path) == ""
    svc = service_section(unit)
    assert svc["Type"] == "notify" and svc["NotifyAccess"] == "main"
    assert svc["ExecStart"].split()[0] == str(DS4D.absolute())
    assert svc["RestartPreventExitStatus"] == exitcodes.NO_RESTART
    assert svc["Restart"] == "on-failure"
    for key in ("WatchdogSec", "TimeoutStartSec", "TimeoutStopSec", "ExecReload"):
        assert svc[key]
    if kind == "system":
        assert svc["ExecStart"].endswith("--config /etc/ds4d/ds4d.toml")
        for key, value in [
            ("DynamicUser", "yes"),
            ("RuntimeDirectory", "ds4d"),
            ("RuntimeDirectoryMode", "0700"),
            ("StateDirectory", "ds4d"),
            ("CacheDirectory", "ds4d"),
            ("LogsDirectory", "ds4d"),
            ("NoNewPrivileges", "yes"),
            ("ProtectSystem", "strict"),
            ("PrivateTmp", "yes"),
        ]:
            assert svc[key] == value, key
        assert svc["ProtectHome"] in ("yes", "read-only")


@needs_analyze
def test_verify_catches_a_broken_unit(tmp_path):
    """The check above would notice a mistake (it is not vacuous)."""
    assert install("system", tmp_path).returncode == 0
    unit = tmp_path / "ds4d.service"
    text = unit.read_text()
    unit.write_text(text.replace("Type=notify", "Type=notifyy"))
    assert "Failed to parse service type" in verify(unit, False, tmp_path)
    unit.write_text(text.replace(str(DS4D.absolute()), "/nonexistent/ds4d"))
    assert "not executable" in verify(unit, False, tmp_path)


def test_launchd_plist_round_trips(tmp_path):
    done = install("launchd", tmp_path)
    assert done.returncode == 0, done.stderr
    raw = (tmp_path / "com.ds4d.daemon.plist").read_bytes()
    plist = plistlib.loads(raw)
    assert plistlib.loads(plistlib.dumps(plist)) == plist
    assert plist["Label"] == "com.ds4d.daemon"
    assert plist["ProgramArguments"] == [str(DS4D.absolute()), "serve"]
    assert plist["RunAtLoad"] is True
    assert plist["KeepAlive"] == {"SuccessfulExit": False}
    assert plist["ProcessType"] == "Interactive"
    assert isinstance(plist["ExitTimeOut"], int) and plist["ExitTimeOut"] >= 60
    home = os.environ.get("HOME") or str(Path.home())
    assert plist["StandardErrorPath"].startswith(home + "/Library/Logs/ds4d/")
    assert plist["StandardOutPath"].startswith(home + "/Library/Logs/ds4d/")
    assert str(DS4D.parent) in plist["EnvironmentVariables"]["PATH"].split(":")


def test_dry_run_prints_and_writes_nothing(tmp_path):
    done = install("user", tmp_path, "--dry-run")
    assert done.returncode == 0
    assert done.stdout.startswith(f"# would write {tmp_path / 'ds4d.service'}\n")
    assert "Type=notify" in done.stdout
    assert not any(tmp_path.iterdir())


def test_a_kind_is_required():
    done = subprocess.run(
        [str(DS4D), "install-service"], capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 2 and "one of the arguments" in done.stderr
