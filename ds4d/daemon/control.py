"""The control plane around a running daemon, in one place for main.py to start.

    control = ControlPlane.from_args(args)          # ConfigError -> exit CONFIG_ERROR
    config = control.config                         # the effective Config at start
    ... build the Daemon ...
    control.attach(daemon, cache=disk_cache, trace=trace_writer)
    await nursery.start(control.run)                # admin socket bound, watchers running
    ... bind HTTP, load the model ...
    control.ready(daemon)                           # READY=1
    ... on SIGTERM: control.stopping(); control.extend_timeout(s) around shutdown saves

It owns the live config (file watching, SIGHUP, `ds4ctl config reload/set`), the admin
socket, sd_notify and its watchdog, and the power governor, and pushes every live config
change to the parts that follow it: the daemon's `config`, the governor, the log level,
the disk cache budget and the trace file.
"""

from __future__ import annotations

import argparse
import logging
from pathlib import Path
from typing import TYPE_CHECKING

import trio

from ds4d.daemon import admin, admin_protocol, logs
from ds4d.daemon.config import Config
from ds4d.daemon.notify import Notifier, run_watchdog
from ds4d.daemon.power import PowerGovernor
from ds4d.daemon.reload import LiveConfig, reload_on_sighup, watch_files
from ds4d.state.service import CacheView
from ds4d.state.trace import TraceWriter

if TYPE_CHECKING:  # the daemon is built after the control plane (see main.py)
    from ds4d.daemon.server import Daemon

log = logging.getLogger("ds4d.control")

STATUS_EVERY_S = 2.0


class ControlPlane:
    def __init__(self, live: LiveConfig, notifier: Notifier) -> None:
        self.live = live
        self.notifier = notifier
        self.governor = PowerGovernor(live.current.power)
        self.socket_path: Path = admin_protocol.socket_path_for(live.current.admin_socket)
        self.daemon: Daemon | None = None
        self.cache: CacheView | None = None
        self.trace: TraceWriter | None = None
        self._serving: str | None = None  # the READY status line, once ready
        self._nursery: trio.Nursery | None = None  # runs blocking follow-ups of changes
        live.subscribe(self._follow)

    @classmethod
    def from_args(cls, args: argparse.Namespace | None = None) -> ControlPlane:
        """Load the config from every source (raises ConfigError) and set up logging."""
        notifier = Notifier()
        live = LiveConfig.load(args, notifier=notifier)
        logs.setup_logging(live.current)
        return cls(live, notifier)

    @property
    def config(self) -> Config:
        return self.live.current

    def attach(
        self, daemon: Daemon, cache: CacheView | None = None, trace: TraceWriter | None = None
    ) -> None:
        """Connect the daemon (`status/slots/stop`, `reload_config`; it paces its engine
        with `governor.rest`, given at its construction), the disk cache
        (`ls/evict/stats_dict`, `set_budget`) and the trace writer (`open/close`)."""
        self.daemon, self.cache, self.trace = daemon, cache, trace
        if trace is not None and self.config.trace:
            trace.open(self.config.trace, self.config.trace_content)

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        """Serve the admin socket, ping the watchdog, watch the config; reports started
        once the socket is bound. Raises admin.SocketInUseError (exit ADDRESS_IN_USE)."""
        assert self.daemon is not None, "attach the daemon first"
        commands = admin.AdminCommands(self.daemon, self.live, self.cache)
        async with trio.open_nursery() as nursery:
            self._nursery = nursery
            nursery.start_soon(run_watchdog, self.notifier)
            if self.notifier.enabled:
                nursery.start_soon(self._report_status)
            await nursery.start(
                lambda task_status: admin.serve(
                    self.socket_path, commands, log=log.warning, task_status=task_status
                )
            )
            log.info("admin socket %s", self.socket_path)
            await nursery.start(lambda task_status: watch_files(self.live, task_status=task_status))
            await nursery.start(
                lambda task_status: reload_on_sighup(self.live, task_status=task_status)
            )
            task_status.started()

    # -- sd_notify milestones ---------------------------------------------------------------

    def status(self, text: str) -> None:
        self.notifier.status(text)

    def ready(self, what: str = "serving") -> None:
        self.notifier.ready(status=what)
        self._serving = what

    async def _report_status(self) -> None:
        """Keep `systemctl status` current: what is served, slots busy, queue, power."""
        last = None
        while True:
            await trio.sleep(STATUS_EVERY_S)
            if self._serving is None or self.daemon is None:
                continue
            try:
                s = self.daemon.status()
                text = (
                    f"{self._serving}; slots busy {s['slots']['busy']}/"
                    f"{s['slots']['total']}, queued {s['queue']['waiting']}, "
                    f"power {self.config.power}%"
                )
            except Exception:  # a status line is never worth a crash
                continue
            if text != last:
                self.notifier.status(text)
                last = text

    def stopping(self, why: str = "stopping") -> None:
        self.notifier.stopping(why)

    def extend_timeout(self, seconds: float) -> None:
        self.notifier.extend_timeout(seconds)

    # -- live config ------------------------------------------------------------------------

    def _follow(self, config: Config, changed: list[str]) -> None:
        if "power" in changed:
            self.governor.set_level(config.power)
            log.info("power is now %d%%", config.power)
        logs.apply_config_change(config, changed)
        if self.daemon is not None:
            self.daemon.reload_config(config)
        if self.cache is not None and "kv_disk_space_mb" in changed:
            self._apply_budget(self.cache, config.kv_disk_space_mb * 1024 * 1024)
        if self.trace is not None and {"trace", "trace_content"} & set(changed):
            if config.trace:
                self.trace.open(config.trace, config.trace_content)
                log.info("tracing to %s", config.trace)
            else:
                self.trace.close()
                log.info("tracing off")

    def _apply_budget(self, cache: CacheView, budget: int) -> None:
        """A smaller budget evicts, which deletes files: on a worker thread, never on the
        loop (a change before `run` applies at once)."""
        if self._nursery is None:
            cache.set_budget(budget)
            return

        async def evict() -> None:
            try:
                removed = await trio.to_thread.run_sync(cache.set_budget, budget)
            except Exception:  # a failed eviction must not take the control plane down
                log.exception("applying the disk budget failed")
                return
            log.info("disk budget now %d MiB (%d checkpoint(s) evicted)",
                     budget // (1024 * 1024), len(removed))  # fmt: skip

        self._nursery.start_soon(evict)
