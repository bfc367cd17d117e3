"""Live steering through the admin socket (`ds4ctl steer show|set|off`, docs/steering.md):
the arguments checked, the control-vector files read on a worker thread, and the result
handed to the model's engine loop, which gives it to the requests submitted after (those
already running keep theirs)."""

from __future__ import annotations

import math
from typing import Any

import trio

from ds4d.daemon.admin_protocol import AdminError
from ds4d.daemon.served import ServedModel, steering_about
from ds4d.engine.steering import SteeringError, load_control_vectors


def show(model: ServedModel) -> dict[str, Any]:
    return {"model": model.name, **model.server.steering()}


def _number(value: Any, what: str) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
        raise AdminError(f"{what} must be a finite number, not {value!r}")
    return float(value)


def _files(files: Any) -> list[tuple[str, float]]:
    if not isinstance(files, list) or not files:
        raise AdminError("steer set needs at least one control-vector file")
    out = []
    for item in files:
        if not (isinstance(item, list) and len(item) == 2 and isinstance(item[0], str)):
            raise AdminError(f"each file is [PATH, SCALE], not {item!r}")
        out.append((item[0], _number(item[1], f"the scale of {item[0]}")))
    return out


def _layer_range(value: Any) -> tuple[int, int] | None:
    if value is None:
        return None
    ok = isinstance(value, list) and len(value) == 2
    ok = ok and all(isinstance(n, int) and not isinstance(n, bool) for n in value)
    if not ok or not 0 <= value[0] <= value[1]:
        raise AdminError(f"the layer range is [START, END] with 0 <= START <= END, not {value!r}")
    return value[0], value[1]


async def set_live(model: ServedModel, files: Any, layer_range: Any = None, attn: Any = 0.0,
                   ffn: Any = 1.0) -> dict[str, Any]:  # fmt: skip
    """llama.cpp's --control-vector-scaled FILE SCALE (repeatable, summed),
    --control-vector-layer-range START END, and ds4's attention / FFN scales."""
    scaled = _files(files)
    span = _layer_range(layer_range)
    attn_scale, ffn_scale = _number(attn, "attn"), _number(ffn, "ffn")
    info = model.engine.info
    try:
        steering = await trio.to_thread.run_sync(
            lambda: load_control_vectors(
                scaled, info.n_layer, info.n_embd, span, attn_scale=attn_scale, ffn_scale=ffn_scale
            )
        )
    except SteeringError as e:
        raise AdminError(str(e)) from None
    model.server.set_steering(steering, steering_about(scaled, span, "ds4ctl"))
    return show(model)


def off(model: ServedModel) -> dict[str, Any]:
    model.server.set_steering(None)
    return show(model)
