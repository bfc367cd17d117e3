"""The `ds4d` command: `ds4d [serve] ...`, `ds4d bench`, `ds4d generate`, ...

Each subcommand lives in its own module exposing `add_arguments(parser)` and
`run(args) -> int`; modules are imported only when their subcommand runs, so `ds4d bench`
never pays for the HTTP stack and a broken optional part cannot break the others.
"""

from __future__ import annotations

import argparse
import importlib
import sys
from types import ModuleType

from ds4d.daemon.exitcodes import CliError

# name -> (module, one-line help)
SUBCOMMANDS: dict[str, tuple[str, str]] = {
    "serve": ("ds4d.daemon.main", "run the daemon (the default)"),
    "generate": ("ds4d.cli.generate", "one-shot chat reply streamed to stdout"),
    "chat": ("ds4d.cli.chat_repl", "interactive chat, against the daemon or in-process (--local)"),
    "eval": ("ds4d.cli.evaluate", "run the embedded question set and score the model"),
    "steer": ("ds4d.cli.steer", "build (or show) a steering direction: llama.cpp control vectors"),
    "bench": (
        "ds4d.tools.bench",
        "prefill/decode speed sweep over context sizes (`ds4d bench serve`: the serving benchmark)",
    ),
    "synth-gguf": ("ds4d.tools.synth", "write a small synthetic GGUF for tests"),
    "install-service": ("ds4d.daemon.install", "write systemd / launchd units"),
}

# Modes of a subcommand that are commands of their own: (subcommand, mode) -> (module, help)
NESTED: dict[tuple[str, str], tuple[str, str]] = {
    ("bench", "serve"): (
        "ds4d.tools.bench_serve",
        "concurrent clients replaying conversations "
        "against a running server: tokens/s, time to first token",
    ),
    ("bench", "infill"): (
        "ds4d.tools.bench_infill",
        "an editing session replayed against running servers' /infill: "
        "tokens reused, time to first token",
    ),
    ("bench", "spec"): (
        "ds4d.tools.bench_spec",
        "decode tokens/s with speculative decoding off, by prompt lookup and with a draft "
        "model, on agent-shaped workloads (and llama.cpp's beside it)",
    ),
    ("bench", "embed"): (
        "ds4d.tools.bench_embed",
        "embedding throughput on chunks of ds4d's source, against llama.cpp's llama-server",
    ),
}


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if not argv or argv[0] not in SUBCOMMANDS and argv[0] not in ("-h", "--help", "--version"):
        argv.insert(0, "serve")
    if len(argv) >= 2 and (argv[0], argv[1]) in NESTED:
        return _main_nested((argv[0], argv[1]), argv[2:])
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
    return _run(module, args)


def _main_nested(key: tuple[str, str], argv: list[str]) -> int:
    module_name, help_text = NESTED[key]
    parser = argparse.ArgumentParser(prog="ds4d " + " ".join(key), description=help_text)
    module = importlib.import_module(module_name)
    module.add_arguments(parser)
    return _run(module, parser.parse_args(argv))


def _run(module: ModuleType, args: argparse.Namespace) -> int:
    try:
        return int(module.run(args) or 0)
    except CliError as e:
        print(f"ds4d: {e}", file=sys.stderr)
        return e.code
    except KeyboardInterrupt:
        return 130


def _load(cmd: str) -> ModuleType | None:
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
