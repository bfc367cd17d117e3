"""The state layer built from the daemon's Config: the kv_* and tool_* keys become
`StateService.create`'s arguments (the state layer knows nothing of the config file)."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable

from ds4d.daemon.config import Config, kv_dir
from ds4d.engine.engine import Engine
from ds4d.state.service import StateService
from ds4d.state.trace import TraceWriter

_DEFAULTS = {f.name: f.default for f in dataclasses.fields(Config)}


def state_from_config(
    config: Config,
    *,
    engine: Engine,
    ctx: int,
    trace: TraceWriter | None = None,
    current: Callable[[], Config] | None = None,
) -> StateService:
    """A StateService for the loaded model (blocking: it scans the disk cache). A
    kv-cache knob left at its built-in value is fitted to the context instead.
    `current` returns the live config (reloadable keys: the billing-line switch)."""
    live = current or (lambda: config)

    def knob(key: str) -> int | None:
        value = getattr(config, key)
        assert isinstance(value, int)
        return None if value == _DEFAULTS.get(key) else value

    policy = {
        key: knob(f"kv_cache_{key}")
        for key in (
            "min_tokens",
            "cold_max_tokens",
            "continued_interval_tokens",
            "boundary_trim_tokens",
            "boundary_align_tokens",
        )
    }
    service = StateService.create(
        tokenizer=engine.tokenizer,
        # Checkpoints hold KV rows of one type: another --kv-type (or --precision, whose
        # rows differ in the last bits) is another cache; and rows computed under one
        # steering: the control vectors the daemon starts with are another cache, which
        # a session steered otherwise (a request's own, `ds4ctl steer set`) keeps off.
        fingerprint=f"{engine.info.fingerprint}/kv-{engine.info.kv_type}"
        + ("" if engine.info.precision == "exact" else f"/{engine.info.precision}")
        + (f"/steer-{engine.steering_key}" if engine.steering_key else ""),
        steering_key=engine.steering_key,
        ctx=ctx,
        # each start steering's checkpoints in a directory of their own: a restart under
        # other control vectors neither reads nor quarantines them
        kv_dir=(
            kv_dir(config) / (f"steer-{engine.steering_key}" if engine.steering_key else "")
            if config.kv_disk
            else None
        ),
        space_mb=config.kv_disk_space_mb,
        write_budget_mb=config.kv_disk_write_budget,
        policy=policy,
        tool_memory_max_ids=config.tool_memory_max_ids,
        tool_replay=config.tool_replay,
        normalize=lambda: live().normalize_claude_billing_header,
        trace=trace,  # the writer the control plane switches at runtime
    )
    return service
