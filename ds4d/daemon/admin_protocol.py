"""The admin channel's wire protocol: socket paths, framing, and the blocking client.

Version 1, newline-delimited JSON; each request is one line, each reply one line:

    -> {"v": 1, "cmd": "cache.evict", "args": {"prefix": "3fa2"}}
    <- {"v": 1, "ok": true, "result": {...}}
    <- {"v": 1, "ok": false, "error": {"code": "bad_request", "message": "..."}}

Pure stdlib: this is all `ds4ctl` imports; the daemon's trio server is ds4d.daemon.admin.
"""

from __future__ import annotations

import json
import os
import socket
import tempfile
from collections.abc import Mapping
from pathlib import Path
from typing import Any

PROTOCOL_VERSION = 1
MAX_LINE_BYTES = 1 << 20
SOCKET_NAME = "ds4d.sock"


class AdminError(Exception):
    """A command failed in an expected way; becomes an error reply."""

    def __init__(self, message: str, code: str = "bad_request") -> None:
        super().__init__(message)
        self.code = code


# --------------------------------------------------------------------------------------
# Paths


def default_socket_path(environ: Mapping[str, str] | None = None) -> Path:
    """Where the daemon listens unless told otherwise.

    Under systemd `$RUNTIME_DIRECTORY` (RuntimeDirectory=ds4d); else
    `$XDG_RUNTIME_DIR/ds4d/ds4d.sock`; else (macOS, bare shells) a per-user directory in
    the temp dir. `DS4D_ADMIN_SOCKET` overrides all of them."""
    env = os.environ if environ is None else environ
    if env.get("DS4D_ADMIN_SOCKET"):
        return Path(env["DS4D_ADMIN_SOCKET"]).expanduser()
    if env.get("RUNTIME_DIRECTORY"):
        return Path(env["RUNTIME_DIRECTORY"].split(":")[0]) / SOCKET_NAME
    if env.get("XDG_RUNTIME_DIR"):
        return Path(env["XDG_RUNTIME_DIR"]) / "ds4d" / SOCKET_NAME
    return Path(tempfile.gettempdir()) / f"ds4d-{os.getuid()}" / SOCKET_NAME


def socket_path_for(config_value: str, environ: Mapping[str, str] | None = None) -> Path:
    """The daemon's socket path given its `admin_socket` config value."""
    return Path(config_value).expanduser() if config_value else default_socket_path(environ)


# --------------------------------------------------------------------------------------
# Framing


def encode(message: Mapping[str, Any]) -> bytes:
    return json.dumps(message, separators=(",", ":"), default=str).encode() + b"\n"


def request(cmd: str, **args: Any) -> dict[str, Any]:
    return {"v": PROTOCOL_VERSION, "cmd": cmd, "args": args}


def ok_reply(result: Any) -> dict[str, Any]:
    return {"v": PROTOCOL_VERSION, "ok": True, "result": result}


def error_reply(code: str, message: str) -> dict[str, Any]:
    return {"v": PROTOCOL_VERSION, "ok": False, "error": {"code": code, "message": message}}


def call(
    path: Path, cmd: str, args: Mapping[str, Any] | None = None, *, timeout: float = 30.0
) -> Any:
    """Blocking client: send one request, return the result or raise AdminError.

    OSError (e.g. FileNotFoundError, ConnectionRefusedError) means no daemon there."""
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock:
        sock.settimeout(timeout)
        sock.connect(str(path))
        try:
            sock.sendall(encode(request(cmd, **(args or {}))))
        except (BrokenPipeError, ConnectionResetError):
            pass  # refused before reading: the reply saying why may still be there
        buf = b""
        while not buf.endswith(b"\n"):
            chunk = sock.recv(65536)
            if not chunk:
                raise AdminError("the daemon closed the connection without a reply", "io")
            buf += chunk
    reply = json.loads(buf)
    if not reply.get("ok"):
        err = reply.get("error") or {}
        raise AdminError(err.get("message", "unknown error"), err.get("code", "error"))
    return reply.get("result")
