"""The admin channel: a Unix socket speaking newline-delimited JSON.

Wire protocol, version 1. Each request is one line, each reply one line:

    -> {"v": 1, "cmd": "cache.evict", "args": {"prefix": "3fa2"}}
    <- {"v": 1, "ok": true, "result": {...}}
    <- {"v": 1, "ok": false, "error": {"code": "bad_request", "message": "..."}}

A connection may carry any number of requests. Commands: status, slots, cache.ls,
cache.evict, cache.stats, trace.on, trace.off, trace.status, power, config.get,
config.set, config.reload, models.ls, models.load, models.unload, steer.show, steer.set,
steer.off, stop.

Who may connect: the socket is 0600 inside a 0700 directory, and every peer's uid is
checked against the daemon's own (and root's) with SO_PEERCRED (Linux) or LOCAL_PEERCRED
(macOS), so a permissive parent directory or a copied descriptor still cannot reach it.

The wire protocol itself (paths, framing, the blocking client) lives in admin_protocol,
the only module `ds4ctl` imports.
"""

from __future__ import annotations

import errno
import inspect
import json
import logging
import os
import socket
import stat
import struct
import sys
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any, Protocol, TypeVar

import trio

from ds4d.daemon.admin_protocol import (  # noqa: F401  (re-exported for the daemon)
    MAX_LINE_BYTES,
    PROTOCOL_VERSION,
    SOCKET_NAME,
    AdminError,
    call,
    default_socket_path,
    encode,
    error_reply,
    ok_reply,
    request,
    socket_path_for,
)

log = logging.getLogger("ds4d.admin")

T = TypeVar("T")

# --------------------------------------------------------------------------------------
# Peer credentials


def peer_uid(sock: socket.socket | trio.socket.SocketType) -> int:
    """The effective uid of the process at the other end of a connected Unix socket."""
    if hasattr(socket, "SO_PEERCRED"):  # Linux: struct ucred {pid_t; uid_t; gid_t}
        raw = sock.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, struct.calcsize("3i"))
        _pid, uid, _gid = struct.unpack("3i", raw)
        return int(uid)
    if sys.platform == "darwin":  # getpeereid(): LOCAL_PEERCRED -> struct xucred
        sol_local, local_peercred = 0, 0x001
        raw = sock.getsockopt(sol_local, local_peercred, 76)
        _version, uid = struct.unpack_from("=II", raw)
        return int(uid)
    raise OSError(errno.ENOTSUP, "peer credentials are not available on this platform")


def peer_allowed(uid: int, allowed: frozenset[int]) -> bool:
    return uid in allowed


def default_allowed_uids() -> frozenset[int]:
    """The daemon's own user, and root (who can read the socket anyway)."""
    return frozenset({os.geteuid(), 0})


# --------------------------------------------------------------------------------------
# Binding the socket safely


class SocketInUseError(Exception):
    """A live daemon already answers on the admin socket path."""


def bind_socket(path: Path) -> socket.socket:
    """A listening Unix socket at `path`, mode 0600, in a directory we keep at 0700.

    A socket file left by a dead daemon is replaced, but only after a connect test shows
    nobody answers; anything that is not a socket is never removed. The new socket is
    bound under a temporary name, chmod-ed, then renamed over the old path, so there is
    no moment where the path is missing or more permissive than 0600."""
    path = path.absolute()
    _ensure_private_dir(path.parent)
    try:
        st = path.lstat()
    except FileNotFoundError:
        st = None
    if st is not None:
        if not stat.S_ISSOCK(st.st_mode):
            raise SocketInUseError(f"{path} exists and is not a socket; not replacing it")
        if _answers(path):
            raise SocketInUseError(f"another ds4d is listening on {path}")
    tmp = path.with_name(f".{path.name}.{os.getpid()}")
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        try:
            tmp.unlink()
        except FileNotFoundError:
            pass
        sock.bind(str(tmp))
        os.chmod(tmp, 0o600)
        sock.listen(64)
        os.replace(tmp, path)
    except BaseException:
        sock.close()
        try:
            tmp.unlink()
        except FileNotFoundError:
            pass
        raise
    return sock


def _ensure_private_dir(directory: Path) -> None:
    """Create missing directories 0700; tighten our own `ds4d` directory if it exists.

    A directory the user named and that already exists (say /tmp) is left alone: the
    socket's own mode and the peer check protect it."""
    if not directory.exists():
        directory.mkdir(mode=0o700, parents=True)
        os.chmod(directory, 0o700)  # mkdir's mode is filtered by the umask
        return
    st = directory.stat()
    if directory.name == "ds4d" and st.st_uid == os.geteuid() and st.st_mode & 0o077:
        os.chmod(directory, 0o700)


def _answers(path: Path) -> bool:
    probe = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    probe.settimeout(1.0)
    try:
        probe.connect(str(path))
        return True
    except (ConnectionRefusedError, FileNotFoundError):
        return False
    except OSError as e:
        return e.errno not in (errno.ECONNREFUSED, errno.ENOENT)
    finally:
        probe.close()


def remove_socket(path: Path, inode: int) -> None:
    """Unlink `path` if it is still the socket we bound (a successor may own it now)."""
    try:
        st = path.lstat()
        if stat.S_ISSOCK(st.st_mode) and st.st_ino == inode:
            path.unlink()
    except OSError:
        pass


# --------------------------------------------------------------------------------------
# What the daemon provides


class DaemonView(Protocol):
    """The daemon state the admin channel reports on (implemented by the daemon)."""

    def status(self) -> dict[str, Any]:
        """model, uptime_s, slots {total, busy}, queue {waiting, limit}, http, pid..."""

    def slots(self) -> list[dict[str, Any]]:
        """One dict per slot: id, state, tokens, ctx, last_used..."""

    async def stop(self) -> None:
        """Begin a graceful shutdown (as SIGTERM does) and return at once."""

    def decode_batching(self) -> dict[str, int | float | None] | None:
        """Batched decode so far (steps, slot steps, mean batch), None without a model."""

    def model_list(self) -> list[dict[str, Any]]:
        """Every configured model: name, path, aliases, roles, state, memory, expiry."""

    async def load_named(self, name: str) -> dict[str, Any]:
        """Load a model now (AdminError for a name the daemon does not have)."""

    async def unload_named(self, name: str) -> dict[str, Any]:
        """Unload a model once no request holds it."""

    def steering_show(self, model: str | None = None) -> list[dict[str, Any]]:
        """Each loaded model's steering (or `model`'s): files, scales, layers, key."""

    async def steering_set(self, model: str | None = None, **args: Any) -> dict[str, Any]:
        """Steer the model's next requests (AdminError for bad files or arguments)."""

    def steering_off(self, model: str | None = None) -> dict[str, Any]:
        """The model's next requests unsteered."""


class CacheView(Protocol):
    """The disk KV cache's admin surface (ds4d.state.service.CacheView, DiskCache).

    Setting `budget` (bytes) applies a new size limit, evicting beyond it."""

    def ls(self) -> list[dict[str, Any]]:
        """One dict per checkpoint (name, tokens, size, hits, reason, last_used...)."""

    def evict(
        self,
        prefix: str | None = None,
        *,
        everything: bool = False,
        older_than_s: float | None = None,
    ) -> list[str]:
        """Remove matching checkpoints; returns the names removed."""

    def stats_dict(self) -> dict[str, Any]:
        """entries, bytes_used, budget_bytes, hits, misses, bytes_written, evictions..."""


class LiveSettings(Protocol):
    """The running config (ds4d.daemon.reload.LiveConfig)."""

    def get(self, key: str | None = None) -> dict[str, Any]: ...
    def set_runtime(self, key: str, value: Any) -> Any: ...
    async def set_persistent(self, key: str, value: str) -> dict[str, Any]: ...
    def reload(self) -> dict[str, Any]: ...


# --------------------------------------------------------------------------------------
# Commands


async def _off_loop(fn: Callable[[], T]) -> T:
    return await trio.to_thread.run_sync(fn)


class AdminCommands:
    """Maps protocol commands onto the daemon, cache and live config."""

    def __init__(
        self, daemon: DaemonView, live: LiveSettings, cache: CacheView | None = None
    ) -> None:
        self.daemon = daemon
        self.live = live
        self.cache = cache
        self._table: dict[str, Callable[..., Any]] = {
            "status": self.status,
            "slots": self.daemon.slots,
            "cache.ls": self.cache_ls,
            "cache.evict": self.cache_evict,
            "cache.stats": self.cache_stats,
            "trace.on": self.trace_on,
            "trace.off": self.trace_off,
            "trace.status": self.trace_status,
            "power": self.power,
            "config.get": self.config_get,
            "config.set": self.config_set,
            "config.reload": self.live.reload,
            "stop": self.stop,
            "models.ls": self.models_ls,
            "models.load": self.models_load,
            "models.unload": self.models_unload,
            "steer.show": self.steer_show,
            "steer.set": self.steer_set,
            "steer.off": self.steer_off,
        }

    @property
    def commands(self) -> list[str]:
        return sorted(self._table)

    async def dispatch(self, message: Any) -> dict[str, Any]:
        if not isinstance(message, dict):
            return error_reply("bad_request", "a request is a JSON object")
        version = message.get("v")
        if version != PROTOCOL_VERSION:
            return error_reply(
                "unsupported_version",
                f"protocol version {version!r} not supported "
                f"(this daemon speaks {PROTOCOL_VERSION})",
            )
        cmd, args = message.get("cmd"), message.get("args") or {}
        fn = self._table.get(cmd) if isinstance(cmd, str) else None
        if fn is None:
            return error_reply("unknown_command", f"unknown command {cmd!r}")
        if not isinstance(args, dict):
            return error_reply("bad_request", "args must be a JSON object")
        try:
            inspect.signature(fn).bind(**args)
        except TypeError as e:
            return error_reply("bad_request", f"{cmd}: {e}")
        try:
            result = fn(**args)
            if inspect.isawaitable(result):
                result = await result
        except AdminError as e:
            return error_reply(e.code, str(e))
        except RuntimeError as e:  # a part that is not available (yet): say so
            return error_reply("unavailable", f"{cmd}: {e}")
        except Exception as e:  # a failing command must not take the admin socket down
            log.exception("admin: %s failed", cmd)
            return error_reply("failed", f"{cmd}: {e}")
        return ok_reply(result)

    # -- individual commands -----------------------------------------------------------

    async def status(self) -> dict[str, Any]:
        settings = self.live.get()["values"]
        out = dict(self.daemon.status())
        out["power"] = settings["power"]
        out["trace"] = settings["trace"] or None
        out["decode"] = self.daemon.decode_batching()  # batched decode: mean batch size
        try:
            cache = self.cache
            out["cache"] = await _off_loop(cache.stats_dict) if cache is not None else None
        except Exception:  # not available yet (model loading) or disabled
            out["cache"] = None
        return out

    def _need_cache(self) -> CacheView:
        if self.cache is None:
            raise AdminError("this daemon has no disk KV cache (kv_disk is off)", "unavailable")
        return self.cache

    # The cache commands read or delete files: on a worker thread, never on the loop.

    async def cache_ls(self) -> list[dict[str, Any]]:
        return await _off_loop(self._need_cache().ls)

    async def cache_evict(
        self, prefix: str | None = None, all: bool = False, older_than: float | None = None
    ) -> dict[str, Any]:
        if not (prefix or all or older_than is not None):
            raise AdminError("cache evict needs a key prefix, all, or older_than")
        if older_than is not None and (not isinstance(older_than, (int, float)) or older_than < 0):
            raise AdminError("older_than must be a number of seconds >= 0")
        cache = self._need_cache()
        removed = await _off_loop(
            lambda: cache.evict(prefix or None, everything=bool(all), older_than_s=older_than)
        )
        return {"evicted": len(removed), "names": removed}

    async def cache_stats(self) -> dict[str, Any]:
        return await _off_loop(self._need_cache().stats_dict)

    def trace_on(self, path: str | None = None) -> dict[str, Any]:
        current = self.live.get()["values"]["trace"]
        target = str(Path(path).expanduser().absolute()) if path else current
        if not target:
            raise AdminError("trace on needs a PATH (no trace file is configured)")
        try:  # fail here, in the reply, rather than later in the daemon's log
            os.close(os.open(target, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600))
        except OSError as e:
            raise AdminError(f"cannot open trace file {target}: {e.strerror}", "io") from None
        self.live.set_runtime("trace", target)
        return self.trace_status()

    def trace_off(self) -> dict[str, Any]:
        self.live.set_runtime("trace", "")
        return self.trace_status()

    def trace_status(self) -> dict[str, Any]:
        values = self.live.get()["values"]
        return {
            "enabled": bool(values["trace"]),
            "path": values["trace"] or None,
            "content": values["trace_content"],
        }

    def power(self, level: int | None = None) -> dict[str, Any]:
        if level is not None:
            if isinstance(level, bool) or not isinstance(level, int) or not 1 <= level <= 100:
                raise AdminError(f"power must be an integer from 1 to 100, not {level!r}")
            self.live.set_runtime("power", level)
        return {"power": self.live.get()["values"]["power"]}

    def config_get(self, key: str | None = None) -> dict[str, Any]:
        return self.live.get(key)

    async def config_set(self, key: str, value: Any) -> dict[str, Any]:
        return await self.live.set_persistent(
            key, value if isinstance(value, str) else json.dumps(value)
        )

    def models_ls(self) -> list[dict[str, Any]]:
        return self.daemon.model_list()

    async def models_load(self, name: str) -> dict[str, Any]:
        return await self.daemon.load_named(name)

    async def models_unload(self, name: str) -> dict[str, Any]:
        return await self.daemon.unload_named(name)

    # Steering applies to the requests submitted after the reply; those running keep theirs.

    def steer_show(self, model: str | None = None) -> list[dict[str, Any]]:
        return self.daemon.steering_show(model)

    async def steer_set(
        self,
        files: list[Any],
        model: str | None = None,
        layer_range: list[int] | None = None,
        attn: float = 0.0,
        ffn: float = 1.0,
    ) -> dict[str, Any]:
        return await self.daemon.steering_set(
            model, files=files, layer_range=layer_range, attn=attn, ffn=ffn
        )

    def steer_off(self, model: str | None = None) -> dict[str, Any]:
        return self.daemon.steering_off(model)

    async def stop(self) -> dict[str, Any]:
        await self.daemon.stop()
        return {"stopping": True}


# --------------------------------------------------------------------------------------
# Server (trio)


async def serve(
    path: Path,
    commands: AdminCommands,
    *,
    allowed_uids: frozenset[int] | None = None,
    log: Callable[[str], None] | None = None,
    task_status: trio.TaskStatus[Path] = trio.TASK_STATUS_IGNORED,
) -> None:
    """Serve the admin socket until cancelled; reports the bound path via task_status.

    Raises SocketInUseError before binding when another daemon owns the path."""
    allowed = default_allowed_uids() if allowed_uids is None else allowed_uids
    raw = bind_socket(path)
    inode = path.lstat().st_ino
    listener = trio.SocketListener(trio.socket.from_stdlib_socket(raw))
    try:
        task_status.started(path)

        async def handle(stream: trio.SocketStream) -> None:
            await _handle_connection(stream, commands, allowed, log)

        await trio.serve_listeners(handle, [listener])
    finally:
        remove_socket(path, inode)
        await listener.aclose()


async def _handle_connection(
    stream: trio.SocketStream,
    commands: AdminCommands,
    allowed: frozenset[int],
    log: Callable[[str], None] | None,
) -> None:
    async with stream:
        try:
            uid = peer_uid(stream.socket)
        except OSError as e:
            uid, why = -1, str(e)
        else:
            why = f"peer uid {uid} is not allowed"
        if not peer_allowed(uid, allowed):
            if log:
                log(f"admin: refused connection: {why}")
            await _refuse(stream, error_reply("forbidden", why))
            return
        buf = b""
        try:
            while True:
                while b"\n" not in buf:
                    if len(buf) > MAX_LINE_BYTES:
                        await _refuse(stream, error_reply("bad_request", "request line too long"))
                        return
                    chunk = await stream.receive_some(65536)
                    if not chunk:
                        return
                    buf += chunk
                line, buf = buf.split(b"\n", 1)
                if not line.strip():
                    continue
                try:
                    message = json.loads(line)
                except (ValueError, UnicodeDecodeError) as e:
                    reply = error_reply("bad_request", f"invalid JSON: {e}")
                else:
                    reply = await commands.dispatch(message)
                await _send(stream, reply)
        except (trio.BrokenResourceError, trio.ClosedResourceError):
            return


async def _send(stream: trio.SocketStream, message: Mapping[str, Any]) -> None:
    await stream.send_all(encode(message))


async def _refuse(stream: trio.SocketStream, message: Mapping[str, Any]) -> None:
    """Reply, then read (and drop) what the peer sends for a moment before closing:
    closing on unread data would reset the connection and lose the reply."""
    try:
        await _send(stream, message)
        await stream.send_eof()
        with trio.move_on_after(1.0):
            while await stream.receive_some(65536):
                pass
    except (trio.BrokenResourceError, trio.ClosedResourceError):
        pass
