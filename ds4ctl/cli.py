"""ds4ctl: inspect and steer a running ds4d through its admin socket.

Exit status: 0 success, 1 the daemon refused or the command failed, 2 no daemon could be
reached (the message names the socket path tried) or bad usage.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import sys
import time
from pathlib import Path
from typing import Any

from ds4d.daemon.admin_protocol import AdminError, call, default_socket_path

EXIT_FAILED = 1
EXIT_UNREACHABLE = 2

_DURATION = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([smhdw]?)\s*$")
_UNIT_SECONDS = {"": 1, "s": 1, "m": 60, "h": 3600, "d": 86400, "w": 604800}


def parse_duration(text: str) -> float:
    """'90', '90s', '15m', '6h', '2d', '1w' -> seconds."""
    m = _DURATION.match(text.lower())
    if not m:
        raise argparse.ArgumentTypeError(f"not a duration: {text!r} (e.g. 90s, 15m, 6h, 2d)")
    return float(m.group(1)) * _UNIT_SECONDS[m.group(2)]


def _power_level(text: str) -> int:
    try:
        level = int(text)
    except ValueError:
        level = 0
    if not 1 <= level <= 100:
        raise argparse.ArgumentTypeError(f"power is an integer from 1 to 100, not {text!r}")
    return level


def _global_flags(parser: argparse.ArgumentParser, *, defaults: bool) -> None:
    """--socket, --json, --timeout. They are accepted before and after the command
    (`ds4ctl --json status`, `ds4ctl status --json`); only the top level sets defaults,
    so a flag given after the command is not reset by the command's parser."""

    def default(value: Any) -> Any:
        return value if defaults else argparse.SUPPRESS

    parser.add_argument(
        "--socket",
        metavar="PATH",
        type=Path,
        default=default(None),
        help="admin socket (default: $DS4D_ADMIN_SOCKET, else $XDG_RUNTIME_DIR/ds4d/ds4d.sock)",
    )
    parser.add_argument(
        "--json", action="store_true", default=default(False), help="print the raw JSON result"
    )
    parser.add_argument("--timeout", type=float, default=default(30.0), metavar="SECONDS")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="ds4ctl", description=__doc__.splitlines()[0])
    _global_flags(parser, defaults=True)
    common = argparse.ArgumentParser(add_help=False)
    _global_flags(common, defaults=False)
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)

    sub.add_parser(
        "status", parents=[common], help="model, uptime, slots, queue, power, trace, cache"
    )
    sub.add_parser("slots", parents=[common], help="the resident KV slots")

    cache = sub.add_parser("cache", parents=[common], help="the disk KV cache").add_subparsers(
        dest="action", metavar="ACTION", required=True
    )
    cache.add_parser("ls", parents=[common], help="list checkpoints")
    evict = cache.add_parser("evict", parents=[common], help="remove checkpoints")
    evict.add_argument("prefix", nargs="?", help="checkpoint name prefix")
    evict.add_argument("--all", action="store_true", help="remove every checkpoint")
    evict.add_argument(
        "--older-than",
        type=parse_duration,
        metavar="DURATION",
        help="unused for longer than this (90s, 15m, 6h, 2d)",
    )
    cache.add_parser("stats", parents=[common], help="hits, misses, bytes, evictions")

    trace = sub.add_parser("trace", parents=[common], help="per-request trace file").add_subparsers(
        dest="action", metavar="ACTION", required=True
    )
    on = trace.add_parser(
        "on", parents=[common], help="start tracing (to PATH, else the configured file)"
    )
    on.add_argument("path", nargs="?")
    trace.add_parser("off", parents=[common], help="stop tracing")
    trace.add_parser("status", parents=[common], help="is tracing on, and where")

    power = sub.add_parser("power", parents=[common], help="show or set the compute share (1-100)")
    power.add_argument("level", nargs="?", type=_power_level)

    config = sub.add_parser(
        "config", parents=[common], help="the running configuration"
    ).add_subparsers(dest="action", metavar="ACTION", required=True)
    get = config.add_parser("get", parents=[common], help="show all keys, or one")
    get.add_argument("key", nargs="?")
    set_ = config.add_parser(
        "set", parents=[common], help="validate and persist KEY=VALUE, then reload"
    )
    set_.add_argument("key")
    set_.add_argument("value")
    config.add_parser("reload", parents=[common], help="re-read the config files now")

    models = sub.add_parser(
        "models", parents=[common], help="the models this daemon serves"
    ).add_subparsers(dest="action", required=True)
    models.add_parser("ls", parents=[common], help="every model: state, memory, expiry")
    for action, text in (("load", "load a model now"), ("unload", "unload a model")):
        models.add_parser(action, parents=[common], help=text).add_argument("name")
    _steer_parser(sub, common)
    sub.add_parser("stop", parents=[common], help="graceful shutdown")
    return parser


def _steer_parser(sub: Any, common: argparse.ArgumentParser) -> None:
    steer = sub.add_parser(
        "steer", parents=[common], help="live steering: control vectors (docs/steering.md)"
    ).add_subparsers(dest="action", metavar="ACTION", required=True)
    show = steer.add_parser("show", parents=[common], help="each loaded model's steering")
    set_ = steer.add_parser(
        "set",
        parents=[common],
        help="steer the next requests with a control vector FILE times SCALE (default 1); "
        "requests already running keep their steering",
    )
    set_.add_argument("file", help="control-vector GGUF (llama.cpp's format)")
    set_.add_argument("scale", nargs="?", type=float, default=1.0)
    set_.add_argument(
        "--control-vector-scaled", nargs=2, action="append", default=[],
        metavar=("FILE", "SCALE"), help="one more file, summed (repeatable)",
    )  # fmt: skip
    set_.add_argument(
        "--control-vector-layer-range", nargs=2, type=int, metavar=("START", "END"),
        help="apply to these layers only (inclusive; default every layer)",
    )  # fmt: skip
    set_.add_argument(
        "--attn", "--directional-steering-attn", dest="attn", type=float, default=0.0,
        metavar="F", help="scale added after each layer's attention output (default 0)",
    )  # fmt: skip
    set_.add_argument(
        "--ffn", "--directional-steering-ffn", dest="ffn", type=float, default=1.0,
        metavar="F", help="scale added after each layer's FFN output (default 1)",
    )  # fmt: skip
    off = steer.add_parser("off", parents=[common], help="the next requests unsteered")
    for p in (show, set_, off):
        p.add_argument("--model", metavar="NAME", help="this model (default: the default one; "
                       "show: every loaded one)")  # fmt: skip


def _steer_request(args: argparse.Namespace) -> tuple[str, dict[str, Any]]:
    params: dict[str, Any] = {"model": args.model} if args.model else {}
    if args.action != "set":
        return f"steer.{args.action}", params
    files = [[args.file, args.scale]]
    for path, scale in args.control_vector_scaled:
        try:
            files.append([path, float(scale)])
        except ValueError:
            raise SystemExit(f"ds4ctl: the scale of {path} is not a number: {scale!r}") from None
    # paths as this shell sees them: the daemon may run elsewhere
    files = [[str(Path(p).expanduser().absolute()), s] for p, s in files]
    params.update(files=files, attn=args.attn, ffn=args.ffn)
    if args.control_vector_layer_range:
        params["layer_range"] = list(args.control_vector_layer_range)
    return "steer.set", params


def _request(args: argparse.Namespace) -> tuple[str, dict[str, Any]]:
    cmd, action = args.command, getattr(args, "action", None)
    if cmd == "cache" and action == "evict":
        return "cache.evict", {
            k: v
            for k, v in (
                ("prefix", args.prefix),
                ("all", args.all),
                ("older_than", args.older_than),
            )
            if v
        }
    if cmd == "trace" and action == "on":
        path = str(Path(args.path).expanduser().absolute()) if args.path else None
        return "trace.on", {"path": path} if path else {}
    if cmd == "power":
        return "power", {"level": args.level} if args.level is not None else {}
    if cmd == "config" and action == "get":
        return "config.get", {"key": args.key} if args.key else {}
    if cmd == "models" and action in ("load", "unload"):
        return f"models.{action}", {"name": args.name}
    if cmd == "config" and action == "set":
        return "config.set", {"key": args.key, "value": args.value}
    if cmd == "steer":
        return _steer_request(args)
    return (f"{cmd}.{action}" if action else cmd), {}


SYSTEM_SOCKET = Path("/run/ds4d/ds4d.sock")  # the system unit's RuntimeDirectory


def _default_path() -> Path:
    """The user's daemon, else the system service's when only that one exists."""
    path = default_socket_path()
    if not path.exists() and "DS4D_ADMIN_SOCKET" not in os.environ and SYSTEM_SOCKET.exists():
        return SYSTEM_SOCKET
    return path


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if (args.command, getattr(args, "action", None)) == ("cache", "evict") and not (
        args.prefix or args.all or args.older_than is not None
    ):
        parser.error("cache evict needs a PREFIX, --all or --older-than")
    path = args.socket or _default_path()
    cmd, params = _request(args)
    try:
        result = call(path, cmd, params, timeout=args.timeout)
    except (FileNotFoundError, ConnectionRefusedError):
        print(f"ds4ctl: ds4d is not running (no daemon answers on {path})", file=sys.stderr)
        return EXIT_UNREACHABLE
    except PermissionError:
        print(
            f"ds4ctl: permission denied on {path} (the daemon runs as another user?)",
            file=sys.stderr,
        )
        return EXIT_UNREACHABLE
    except TimeoutError:
        print(f"ds4ctl: no reply from {path} within {args.timeout:g}s", file=sys.stderr)
        return EXIT_FAILED
    except OSError as e:
        print(f"ds4ctl: cannot reach ds4d at {path}: {e.strerror or e}", file=sys.stderr)
        return EXIT_UNREACHABLE
    except AdminError as e:
        print(f"ds4ctl: {e}", file=sys.stderr)
        return EXIT_FAILED
    if args.json:
        print(json.dumps(result, indent=2, sort_keys=True, default=str))
    else:
        print(render(cmd, result))
    return 0


# --------------------------------------------------------------------------------------
# Human output

_SLOT_COLUMNS = ("id", "state", "tokens", "ctx", "last_used", "request")
_MODEL_COLUMNS = ("name", "state", "roles", "requests", "memory_bytes", "expires_in_s", "loads")
_CACHE_COLUMNS = ("name", "reason", "tokens", "bytes", "hits", "last_used", "score")


def render(cmd: str, result: Any) -> str:
    if cmd == "slots":
        return table(result, _SLOT_COLUMNS)
    if cmd == "cache.ls":
        return table(result, _CACHE_COLUMNS) if result else "(no checkpoints)"
    if cmd == "cache.evict":
        return f"evicted {result['evicted']} checkpoint(s)"
    if cmd in ("trace.on", "trace.off", "trace.status"):
        if not result["enabled"]:
            return "trace: off"
        return f"trace: on -> {result['path']}" + (
            " (with prompts and output)" if result.get("content") else ""
        )
    if cmd == "power":
        return f"power: {result['power']}%"
    if cmd == "config.get":
        values, sources = result["values"], result["sources"]
        width = max(len(k) for k in values)
        return "\n".join(
            f"{k:<{width}}  {json.dumps(v)}  ({sources[k]})" for k, v in values.items()
        )
    if cmd in ("config.set", "config.reload"):
        lines = []
        if cmd == "config.set":
            lines.append(
                f"{result['key']} = {json.dumps(result['value'])} (written to {result['written']})"
            )
            if result.get("masked_by"):
                lines.append(f"note: {result['masked_by']} takes precedence over the file")
        lines.append("applied: " + (", ".join(result["applied"]) or "nothing changed"))
        if result["restart_required"]:
            lines.append("restart required for: " + ", ".join(result["restart_required"]))
        return "\n".join(lines)
    if cmd == "models.ls":
        return table(result, _MODEL_COLUMNS)
    if cmd in ("models.load", "models.unload"):
        return f"{result['name']}: {result['state']}"
    if cmd == "steer.show":
        return "\n".join(steering_lines(m) for m in result) or "(no model loaded)"
    if cmd in ("steer.set", "steer.off"):
        return steering_lines(result)
    if cmd == "stop":
        return "ds4d is stopping"
    return key_values(result)


def steering_lines(shown: dict[str, Any]) -> str:
    """One model's steering: what it is made of, and the vectors a request may name."""
    s = shown.get("steering")
    if not s:
        line = f"{shown['model']}: unsteered"
    else:
        files = " + ".join(f"{f['path']} x{f['scale']:g}" for f in s.get("files") or [])
        span = s.get("layer_range")
        layers = f"layers {span[0]}..{span[1]}" if span else "every layer"
        line = (f"{shown['model']}: {files}, {layers}, attn {s['attn']:g}, ffn {s['ffn']:g} "
                f"(set by {s.get('set_by', '?')}, key {s['key'] or '-'})")  # fmt: skip
    vectors = shown.get("vectors") or []
    if vectors:
        line += "\n  vectors a request may name: " + ", ".join(vectors)
    return line


def key_values(data: Any, prefix: str = "") -> str:
    """Nested dicts as aligned `key: value` lines (`a.b: 1`)."""
    flat: list[tuple[str, Any]] = []

    def walk(value: Any, key: str) -> None:
        if isinstance(value, dict) and value:
            for k, v in value.items():
                walk(v, f"{key}.{k}" if key else str(k))
        else:
            flat.append((key, value))

    walk(data, prefix)
    if not flat:
        return ""
    width = max(len(k) for k, _ in flat)
    return "\n".join(f"{k + ':':<{width + 1}} {_cell(k, v)}" for k, v in flat)


def table(rows: list[dict[str, Any]], preferred: tuple[str, ...] = ()) -> str:
    if not rows:
        return "(none)"
    keys: list[str] = [k for k in preferred if any(k in r for r in rows)]
    for row in rows:
        keys += [k for k in row if k not in keys and not isinstance(row[k], (dict, list))]
    cells = [[_cell(k, r.get(k)) for k in keys] for r in rows]
    widths = [max(len(k), *(len(c[i]) for c in cells)) for i, k in enumerate(keys)]
    lines = ["  ".join(k.upper().ljust(w) for k, w in zip(keys, widths, strict=True)).rstrip()]
    for c in cells:
        lines.append("  ".join(v.ljust(w) for v, w in zip(c, widths, strict=True)).rstrip())
    return "\n".join(lines)


def _cell(key: str, value: Any) -> str:
    if value is None:
        return "-"
    if isinstance(value, bool):
        return "yes" if value else "no"
    leaf = key.rsplit(".", 1)[-1]
    if isinstance(value, (int, float)):
        if leaf in ("created", "last_used") and value > 1e9:
            return _ago(time.time() - value)
        if leaf in (
            "bytes",
            "size",
            "budget_bytes",
            "bytes_used",
            "bytes_written",
            "evicted_bytes",
            "daily_write_bytes",
            "bytes_written_today",
        ):
            return _size(value)
        if leaf in ("uptime", "uptime_s"):
            return _span(value)
        if isinstance(value, float):
            return f"{value:.3g}"
    if isinstance(value, list):
        return ", ".join(str(v) for v in value) or "-"
    return str(value)


def _size(n: float) -> str:
    for unit in ("B", "KiB", "MiB", "GiB"):
        if abs(n) < 1024 or unit == "GiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return str(n)  # pragma: no cover


def _span(seconds: float) -> str:
    s = int(seconds)
    d, s = divmod(s, 86400)
    h, s = divmod(s, 3600)
    m, s = divmod(s, 60)
    return (f"{d}d " if d else "") + f"{h:02d}:{m:02d}:{s:02d}"


def _ago(seconds: float) -> str:
    if seconds < 90:
        return f"{max(0, int(seconds))}s ago"
    if seconds < 5400:
        return f"{int(seconds // 60)}m ago"
    if seconds < 172800:
        return f"{int(seconds // 3600)}h ago"
    return f"{int(seconds // 86400)}d ago"


if __name__ == "__main__":
    raise SystemExit(main())
