"""The `ds4d` command: `ds4d [serve] ...`, `ds4d bench`, `ds4d generate`, ...

Each subcommand lives in its own module exposing `add_arguments(parser)` and
`run(args) -> int`; modules are imported only when their subcommand runs, so `ds4d bench`
never pays for the HTTP stack and a broken optional part cannot break the others.
"""

from __future__ import annotations

import argparse
import importlib
import sys

from ds4d.daemon.exitcodes import CliError

# name -> (module, one-line help)
SUBCOMMANDS: dict[str, tuple[str, str]] = {
    "serve": ("ds4d.daemon.main", "run the daemon (the default)"),
    "generate": ("ds4d.generate", "one-shot chat reply streamed to stdout"),
    "bench": ("ds4d.bench", "prefill/decode speed sweep over context sizes"),
    "synth-gguf": ("ds4d.synth", "write a small synthetic GGUF for tests"),
    "install-service": ("ds4d.daemon.install", "write systemd / launchd units"),
}


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if not argv or argv[0] not in SUBCOMMANDS and argv[0] not in ("-h", "--help", "--version"):
        argv.insert(0, "serve")
    parser = argparse.ArgumentParser(prog="ds4d", description=__doc__.splitlines()[0])
    parser.add_argument("--version", action="version", version=_version())
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    name = argv[0]
    for cmd, (_, help_text) in SUBCOMMANDS.items():
        p = sub.add_parser(cmd, help=help_text)
        if cmd == name:
            module = _load(cmd)
            if module is not None:
                module.add_arguments(p)
    args = parser.parse_args(argv)
    module = _load(args.command)
    if module is None:
        print(f"ds4d: '{args.command}' is not available in this build", file=sys.stderr)
        return 2
    try:
        return int(module.run(args) or 0)
    except CliError as e:
        print(f"ds4d: {e}", file=sys.stderr)
        return e.code
    except KeyboardInterrupt:
        return 130


def _load(cmd: str):
    module_name = SUBCOMMANDS[cmd][0]
    try:
        return importlib.import_module(module_name)
    except ModuleNotFoundError as e:
        if e.name and module_name.startswith(e.name):
            return None
        raise


def _version() -> str:
    from ds4d import __version__

    return f"ds4d {__version__}"
