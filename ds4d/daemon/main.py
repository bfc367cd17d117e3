"""`ds4d serve` (also plain `ds4d`): the long-running daemon.

Startup order: the HTTP listener binds first (so /health can say "loading" at once), the
model loads on a worker thread with progress in the log (outside ASGI startup, whose
timeout a large model would exceed), then requests are served. SIGTERM/SIGINT stop
accepting, let in-flight requests finish within the grace period, and exit 0.
"""

from __future__ import annotations

import argparse
import logging
import signal
from typing import TYPE_CHECKING

import trio

from ds4d.daemon import exitcodes
from ds4d.daemon.config import Config, ConfigError, add_serve_arguments

if TYPE_CHECKING:  # imported where used: `ds4d --help` stays fast
    from ds4d.daemon.control import ControlPlane
    from ds4d.daemon.server import Daemon

log = logging.getLogger("ds4d")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    add_serve_arguments(parser)


def run(args: argparse.Namespace) -> int:
    from ds4d.daemon.allocator import return_large_blocks
    from ds4d.daemon.control import ControlPlane
    from ds4d.daemon.exitcodes import CliError

    return_large_blocks()  # before anything large is allocated (see allocator.py)

    try:
        control = ControlPlane.from_args(args)  # config from every source, logging
    except ConfigError as e:
        raise CliError(str(e), exitcodes.CONFIG_ERROR) from None
    try:
        return trio.run(serve, control.config, control)
    except BaseException as e:
        # The first SIGINT/SIGTERM drains gracefully (see _signals); a second SIGINT
        # raises KeyboardInterrupt inside the nursery, wrapped in an exception group.
        if isinstance(_sole_cause(e), KeyboardInterrupt):
            log.warning("interrupted again while draining: exiting without shutdown saves")
            return exitcodes.INTERRUPTED
        if not isinstance(e, Exception):
            raise
        log.exception("ds4d stopped on an unexpected error")  # a bug: keep the traceback
        return exitcodes.SOFTWARE


async def serve(config: Config, control: ControlPlane | None = None) -> int:
    from hypercorn.config import Config as HypercornConfig
    from hypercorn.trio import serve as hypercorn_serve

    from ds4d.daemon.server import Daemon, create_app

    daemon = Daemon(config)
    if control is not None:  # control plane: live config, power, admin socket, sd_notify
        control.attach(daemon, cache=daemon.cache_view, trace=daemon.trace)
    app = create_app(daemon)
    hc = HypercornConfig()
    host = "127.0.0.1" if config.host == "localhost" else config.host
    hc.bind = [f"[{host}]:{config.port}" if ":" in host else f"{host}:{config.port}"]
    hc.accesslog = None
    hc.errorlog = logging.getLogger("ds4d.http")
    hc.graceful_timeout = config.grace_period
    hc.keep_alive_timeout = 75
    exit_code = exitcodes.OK

    async with trio.open_nursery() as nursery:
        daemon.nursery = nursery
        if control is not None:
            from ds4d.daemon.admin import SocketInUseError

            try:
                await nursery.start(control.run)
            except Exception as e:  # noqa: BLE001 - only a bind failure is handled here
                cause = _sole_cause(e)
                if not isinstance(cause, (SocketInUseError, OSError)):
                    raise
                log.error("cannot open the admin socket %s: %s", control.socket_path, cause)
                nursery.cancel_scope.cancel()
                return exitcodes.ADDRESS_IN_USE
            control.status("loading model")
        try:
            await nursery.start(
                lambda task_status: hypercorn_serve(
                    app, hc, shutdown_trigger=daemon.shutdown.wait, task_status=task_status
                )
            )
        except Exception as e:  # noqa: BLE001 - only a bind failure is handled here
            cause = _sole_cause(e)
            if not isinstance(cause, OSError):
                raise
            log.error("cannot listen on %s: %s", hc.bind[0], cause)
            nursery.cancel_scope.cancel()
            return exitcodes.ADDRESS_IN_USE
        log.info("listening on http://%s", hc.bind[0])
        nursery.start_soon(_signals, daemon)

        try:
            await daemon.load_model()
        except Exception as e:  # noqa: BLE001 - any load failure is fatal and reported
            daemon.load_error = str(e)
            log.error("cannot load the model: %s", e)
            exit_code = exitcodes.MODEL_LOAD_FAILED
            daemon.shutdown.set()
        else:
            if control is not None:  # READY=1: model loaded, HTTP and admin listening
                control.ready(f"serving {daemon.model_id} on http://{hc.bind[0]}")
        await daemon.shutdown.wait()
        log.info("shutting down")
        if control is not None:
            control.stopping()
        # Hypercorn drains in-flight requests (grace period) once the trigger fires;
        # whatever still runs after it is cancelled with the nursery.
        with trio.move_on_after(config.grace_period + 1):
            while any(m.pool.busy for m in daemon.loaded()):
                await trio.sleep(0.05)
        nursery.cancel_scope.cancel()
    # Every engine call has returned: the slots' sessions are still, save them.
    if control is not None:
        control.extend_timeout(60)
    saved = daemon.save_on_shutdown()
    if saved:
        log.info("saved %d slot(s) to the disk KV cache", saved)
    daemon.trace.close()
    return exit_code


def _sole_cause(error: BaseException) -> BaseException:
    """The error a child task raised: trio's nursery.start wraps it in an ExceptionGroup."""
    inner = getattr(error, "exceptions", None)  # (no BaseExceptionGroup builtin on 3.10)
    while isinstance(inner, tuple) and len(inner) == 1 and isinstance(inner[0], BaseException):
        error = inner[0]
        inner = getattr(error, "exceptions", None)
    return error


async def _signals(daemon: Daemon) -> None:
    with trio.open_signal_receiver(signal.SIGTERM, signal.SIGINT) as signals:
        async for signum in signals:
            log.info("received %s", signal.Signals(signum).name)
            daemon.shutdown.set()
            return
