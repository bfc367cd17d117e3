"""`ds4d install-service --user | --system | --launchd [--dry-run]`.

Fills the templates in ds4d/daemon/units/ (package data) with this installation's real paths (the ds4d executable,
the config file, PATH) and writes them where systemd or launchd looks, then prints the
commands that enable the service. --dry-run prints what would be written instead.
"""

from __future__ import annotations

import argparse
import os
import shutil
import sys
from dataclasses import dataclass
from importlib import resources
from pathlib import Path

# Shipped inside the package, so an installed wheel has them as a checkout does.
TEMPLATES = resources.files("ds4d.daemon") / "units"
DEFAULT_CONFIG = resources.files("ds4d.daemon") / "ds4d.toml"
SYSTEM_CONFIG = Path("/etc/ds4d/ds4d.toml")
HOME_PREFIXES = ("/home/", "/root/", "/run/user/", "/Users/")


@dataclass(frozen=True)
class Rendered:
    path: Path  # where it goes
    text: str
    next_steps: tuple[str, ...]


def add_arguments(parser: argparse.ArgumentParser) -> None:
    kind = parser.add_mutually_exclusive_group(required=True)
    kind.add_argument(
        "--user",
        dest="kind",
        action="store_const",
        const="user",
        help="systemd user unit (~/.config/systemd/user/ds4d.service)",
    )
    kind.add_argument(
        "--system",
        dest="kind",
        action="store_const",
        const="system",
        help="systemd system unit (/etc/systemd/system/ds4d.service)",
    )
    kind.add_argument(
        "--launchd",
        dest="kind",
        action="store_const",
        const="launchd",
        help="launchd agent (~/Library/LaunchAgents/com.ds4d.daemon.plist)",
    )
    parser.add_argument("--dry-run", action="store_true", help="print, write nothing")
    parser.add_argument(
        "--dest", type=Path, metavar="DIR", help="write into DIR instead of the standard location"
    )
    parser.add_argument(
        "--bin",
        type=Path,
        metavar="PATH",
        help="the ds4d executable (default: the one running now)",
    )
    parser.add_argument(
        "--config",
        type=Path,
        metavar="FILE",
        default=SYSTEM_CONFIG,
        help=f"config file of the system service (default: {SYSTEM_CONFIG})",
    )


def run(args: argparse.Namespace) -> int:
    from ds4d.daemon.exitcodes import CliError

    try:
        unit = render(args.kind, bin_path=args.bin, config=args.config, dest=args.dest)
    except FileNotFoundError as e:
        raise CliError(str(e), 1) from None
    if args.dry_run:
        print(f"# would write {unit.path}\n{unit.text}", end="")
        return 0
    try:
        unit.path.parent.mkdir(parents=True, exist_ok=True)
        unit.path.write_text(unit.text)
        print(f"wrote {unit.path}")
        if args.kind == "system" and args.dest is None and not args.config.exists():
            args.config.parent.mkdir(parents=True, exist_ok=True)
            args.config.write_text(DEFAULT_CONFIG.read_text("utf-8"), "utf-8")
            print(f"wrote {args.config} (every key commented out with its default)")
    except PermissionError as e:
        hint = " (run with sudo)" if args.kind == "system" else ""
        raise CliError(f"cannot write {e.filename}: permission denied{hint}", 1) from None
    for step in unit.next_steps:
        print(f"  {step}")
    return 0


def render(
    kind: str,
    *,
    bin_path: Path | None = None,
    config: Path = SYSTEM_CONFIG,
    dest: Path | None = None,
    environ: dict[str, str] | None = None,
) -> Rendered:
    env = dict(os.environ if environ is None else environ)
    ds4d = (bin_path or ds4d_executable()).absolute()
    home = Path(env.get("HOME") or Path.home())
    if kind == "system":
        text = _fill(
            "ds4d.service",
            {
                "@DS4D@": str(ds4d),
                "@CONFIG@": str(config.absolute()),
                "@PROTECT_HOME@": "read-only" if _under_home(ds4d) else "yes",
            },
        )
        target = (dest or Path("/etc/systemd/system")) / "ds4d.service"
        steps = (
            "sudo systemctl daemon-reload",
            "sudo systemctl enable --now ds4d",
            "sudo ds4ctl --socket /run/ds4d/ds4d.sock status",
        )
    elif kind == "user":
        text = _fill("ds4d-user.service", {"@DS4D@": str(ds4d)})
        config_home = Path(env.get("XDG_CONFIG_HOME") or home / ".config")
        target = (dest or config_home / "systemd" / "user") / "ds4d.service"
        steps = (
            "systemctl --user daemon-reload",
            "systemctl --user enable --now ds4d",
            "ds4ctl status",
        )
    elif kind == "launchd":
        path = os.pathsep.join(
            dict.fromkeys(
                [
                    str(ds4d.parent),
                    "/opt/homebrew/bin",
                    "/usr/local/bin",
                    "/usr/bin",
                    "/bin",
                    "/usr/sbin",
                    "/sbin",
                ]
            )
        )
        text = _fill(
            "com.ds4d.daemon.plist",
            {"@DS4D@": _xml(str(ds4d)), "@HOME@": _xml(str(home)), "@PATH@": _xml(path)},
        )
        target = (dest or home / "Library" / "LaunchAgents") / "com.ds4d.daemon.plist"
        steps = (
            f"mkdir -p {home}/Library/Logs/ds4d",
            f"launchctl bootstrap gui/$(id -u) {target}",
            "ds4ctl status",
        )
    else:
        raise ValueError(f"unknown service kind {kind!r}")
    return Rendered(target, text, steps)


def ds4d_executable() -> Path:
    """The `ds4d` console script next to this Python (a venv), else the one on PATH."""
    beside = Path(sys.executable).parent / "ds4d"
    if beside.is_file():
        return beside
    found = shutil.which("ds4d")
    if found:
        return Path(found)
    raise FileNotFoundError("cannot find the ds4d executable; pass --bin PATH")


def _fill(template: str, values: dict[str, str]) -> str:
    path = TEMPLATES / template
    if not path.is_file():
        raise FileNotFoundError(
            f"unit template {template} is missing from the ds4d package (reinstall ds4d)"
        )
    text = path.read_text("utf-8")
    for marker, value in values.items():
        text = text.replace(marker, value)
    return text


def _under_home(path: Path) -> bool:
    return str(path).startswith(HOME_PREFIXES)


def _xml(text: str) -> str:
    return text.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")
