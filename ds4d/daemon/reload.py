"""The running configuration and how it changes: file edits, SIGHUP, `ds4ctl`.

`LiveConfig` holds the effective `Config`. A reload re-reads every source with the same
command line; keys whose loaded value changed are applied if reloadable, and reported as
"restart required" otherwise (the running value is kept). An invalid edit is rejected as a
whole: logged, the running config untouched.

Admin commands such as `power 50` or `trace on` change a key for the running daemon only;
such a value lasts until the file's value for that key changes. `config set` instead
validates the value and writes it to the overrides file (merged after the user's config
file, so their comments are never rewritten), then reloads.

Subscribers (`subscribe(fn)`) are called with (new_config, changed_keys) after every
change; they run on the caller's thread and must be quick (set a level, swap a file).
"""

from __future__ import annotations

import argparse
import dataclasses
import logging
import os
import signal
import sys
import tempfile
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import tomli_w
import trio

from ds4d.daemon.admin_protocol import AdminError
from ds4d.daemon.config import (
    KEY_NAMES,
    RELOADABLE,
    Config,
    ConfigError,
    Resolved,
    changed_keys,
    parse_value,
    resolve_config,
    validate,
)
from ds4d.daemon.notify import Notifier

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover
    import tomli as tomllib

log = logging.getLogger("ds4d.config")

Subscriber = Callable[[Config, list[str]], None]
RUNTIME_SOURCE = "runtime (ds4ctl)"


class LiveConfig:
    def __init__(
        self,
        resolved: Resolved,
        args: argparse.Namespace | None = None,
        environ: Mapping[str, str] | None = None,
        notifier: Notifier | None = None,
    ) -> None:
        self._args = args
        self._environ = dict(os.environ if environ is None else environ)
        self._loaded = resolved
        self._current = resolved.config
        self._sources = dict(resolved.sources)
        self._subscribers: list[Subscriber] = []
        self._notifier = notifier

    @classmethod
    def load(
        cls,
        args: argparse.Namespace | None = None,
        environ: Mapping[str, str] | None = None,
        notifier: Notifier | None = None,
    ) -> LiveConfig:
        """Load from all sources; raises ConfigError (exit with CONFIG_ERROR)."""
        return cls(resolve_config(args, environ), args, environ, notifier)

    @property
    def current(self) -> Config:
        return self._current

    @property
    def watched_files(self) -> list[Path]:
        files = [self._loaded.config_file, self._loaded.overrides_file]
        return [p for p in files if p is not None]

    def subscribe(self, fn: Subscriber) -> None:
        self._subscribers.append(fn)

    # -- reading -----------------------------------------------------------------------

    def get(self, key: str | None = None) -> dict[str, Any]:
        if key is not None and key not in KEY_NAMES:
            raise AdminError(f"unknown config key '{key}'")
        keys = [key] if key else list(KEY_NAMES)
        values = dataclasses.asdict(self._current)
        return {
            "values": {k: values[k] for k in keys},
            "sources": {k: self._sources.get(k, "built-in") for k in keys},
            "reloadable": [k for k in keys if k in RELOADABLE],
            "config_file": str(self._loaded.config_file) if self._loaded.config_file else None,
            "overrides_file": str(self._loaded.overrides_file),
        }

    # -- changing ----------------------------------------------------------------------

    def set_runtime(self, key: str, value: Any) -> Any:
        """Change a reloadable key in the running daemon only (not written anywhere)."""
        if key not in RELOADABLE:
            raise AdminError(f"'{key}' cannot change while running (restart required)")
        try:
            value = parse_value(key, value, "ds4ctl")
            new = dataclasses.replace(self._current, **{key: value})
            validate(new, {key: "ds4ctl"})
        except ConfigError as e:
            raise AdminError(str(e), "invalid_config") from None
        self._sources[key] = RUNTIME_SOURCE
        self._apply(new)
        return value

    async def set_persistent(self, key: str, value: str) -> dict[str, Any]:
        """`config set`: validate, write the overrides file (on a worker thread: its
        fsync can wait long behind other writes), reload."""
        path = self._loaded.overrides_file
        try:
            parsed = parse_value(key, value, "ds4ctl config set")
            validate(dataclasses.replace(self._current, **{key: parsed}), {key: "ds4ctl"})
        except ConfigError as e:
            raise AdminError(str(e), "invalid_config") from None
        overrides: dict[str, Any] = {}
        if path.is_file():
            try:
                overrides = tomllib.loads(path.read_text())
            except (OSError, tomllib.TOMLDecodeError) as e:
                raise AdminError(f"cannot read {path}: {e}", "io") from None
        overrides[key] = parsed
        try:
            await trio.to_thread.run_sync(_write_toml_atomically, path, overrides)
        except OSError as e:
            raise AdminError(f"cannot write {path}: {e.strerror}", "io") from None
        outcome = self.reload()
        source = self._sources.get(key, "built-in")
        masked = source not in (str(path), RUNTIME_SOURCE) and getattr(self._current, key) != parsed
        return {
            "key": key,
            "value": getattr(self._current, key),
            "written": str(path),
            "masked_by": source if masked else None,
            **outcome,
        }

    def reload(self) -> dict[str, Any]:
        """Re-read every source. Returns {"applied": [...], "restart_required": [...]};
        raises AdminError (the running config kept) when the new config is invalid."""
        self._notify("RELOADING=1")
        try:
            try:
                fresh = resolve_config(self._args, self._environ)
            except ConfigError as e:
                log.error("config reload rejected, keeping the running config: %s", e)
                raise AdminError(str(e), "invalid_config") from None
            previous, self._loaded = self._loaded, fresh
            edited = changed_keys(previous.config, fresh.config)
            apply = {k: getattr(fresh.config, k) for k in edited if k in RELOADABLE}
            restart = [k for k in edited if k not in RELOADABLE]
            # A key whose new value equals the running one (say, set at runtime first)
            # still takes its new source.
            for k in edited:
                self._sources[k] = fresh.sources[k]
            new = dataclasses.replace(self._current, **apply)
            try:
                validate(new, self._sources)
            except ConfigError as e:
                self._loaded = previous
                log.error("config reload rejected, keeping the running config: %s", e)
                raise AdminError(str(e), "invalid_config") from None
            applied = [k for k in apply if getattr(self._current, k) != apply[k]]
            if applied:
                self._apply(new)
                log.info(
                    "config reloaded: %s",
                    ", ".join(f"{k}={getattr(new, k)!r}" for k in applied if k != "api_keys")
                    or "api_keys changed",
                )
            if restart:
                log.warning("config: restart required for %s", ", ".join(restart))
            return {"applied": applied, "restart_required": restart}
        finally:
            self._notify("READY=1")

    def _apply(self, new: Config) -> None:
        old, self._current = self._current, new
        changed = changed_keys(old, new)
        if not changed:
            return
        for fn in list(self._subscribers):
            try:
                fn(new, changed)
            except Exception:  # one broken subscriber must not block the others
                log.exception("config subscriber %r failed", fn)

    def _notify(self, state: str) -> None:
        if self._notifier is not None:
            if state == "RELOADING=1":
                self._notifier.reloading()
            else:
                self._notifier.reloaded()


def _write_toml_atomically(path: Path, data: Mapping[str, Any]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    header = (
        "# Written by `ds4ctl config set`; merged after the main config file.\n"
        "# Remove a line to fall back to the config file's value.\n"
    )
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", dir=path.parent)
    try:
        with os.fdopen(fd, "w") as fh:
            fh.write(header + tomli_w.dumps(dict(data)))
            fh.flush()
            os.fsync(fh.fileno())
        os.chmod(tmp, 0o600)
        os.replace(tmp, path)
    except BaseException:
        try:
            os.unlink(tmp)
        except FileNotFoundError:
            pass
        raise


# --------------------------------------------------------------------------------------
# Triggers (trio tasks)


def _safe_reload(live: LiveConfig, why: str) -> None:
    log.info("config: reloading (%s)", why)
    try:
        live.reload()
    except AdminError:
        pass  # already logged; the running config is kept


async def watch_files(
    live: LiveConfig,
    *,
    debounce_ms: int = 200,
    task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED,
) -> None:
    """Reload whenever the config or overrides file changes (editors' atomic renames
    included: the parent directories are watched and filtered by name)."""
    import anyio
    from watchfiles import awatch

    targets = {str(p.absolute()) for p in live.watched_files}
    dirs = sorted({str(Path(t).parent) for t in targets if Path(t).parent.is_dir()})
    task_status.started()
    if not dirs:
        return
    stop = anyio.Event()
    try:
        async for _changes in awatch(
            *dirs,
            watch_filter=lambda _c, p: p in targets,
            debounce=debounce_ms,
            step=50,
            rust_timeout=1000,
            recursive=False,
            stop_event=stop,
        ):
            _safe_reload(live, "file changed")
    finally:
        stop.set()


async def reload_on_sighup(
    live: LiveConfig, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED
) -> None:
    with trio.open_signal_receiver(signal.SIGHUP) as signals:
        task_status.started()
        async for _ in signals:
            _safe_reload(live, "SIGHUP")
