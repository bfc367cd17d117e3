"""The steering one served model offers: the control vectors its config names, which a
request chooses with its `steering` field (docs/steering.md).

A request names a vector the daemon's config declares (`steering_vectors`); it never
hands the daemon a path. The files are read once, when the model loads; a request's
choice becomes a `Steering` from those directions (times its scale, its layer range,
its attention and FFN scales) on a worker thread, while its prompt is prepared. A name
the model does not have, or a vector that does not fit it, is the request's 400.
"""

from __future__ import annotations

import logging
import os
import threading
from collections.abc import Sequence

import numpy as np

from ds4d.chat.errors import PromptRefused
from ds4d.chat.types import STEERING_OFF, SteeringChoice
from ds4d.engine.steering import Steering, SteeringError, load_control_vectors

log = logging.getLogger("ds4d")

PARAM = "steering"
_RESOLVED_KEEP = 16  # choices whose Steering (and its C object) is kept for the next request

VectorSpec = tuple[str, str | os.PathLike[str], float]  # name, file, scale


class SteeringVectors:
    """The named control vectors of one model: each name's files times their scales,
    summed, at every layer (n_layer x n_embd float32), or why the name cannot be used."""

    def __init__(self, dirs: dict[str, np.ndarray], unusable: dict[str, str] | None = None
                 ) -> None:  # fmt: skip
        self._dirs = dirs
        self._unusable = dict(unusable or {})
        self._lock = threading.Lock()
        self._resolved: dict[SteeringChoice, Steering | None] = {}

    @classmethod
    def load(cls, specs: Sequence[VectorSpec], n_layer: int, n_embd: int) -> SteeringVectors:
        """Reads every file (blocking). A name used twice sums its files, as llama.cpp
        sums repeated --control-vector flags. A file that cannot be read or does not fit
        this model's layers and width makes its name unusable (logged), not the model."""
        files: dict[str, list[tuple[str | os.PathLike[str], float]]] = {}
        for name, path, scale in specs:
            files.setdefault(name, []).append((path, scale))
        dirs: dict[str, np.ndarray] = {}
        unusable: dict[str, str] = {}
        for name, scaled in files.items():
            try:
                steering = load_control_vectors(scaled, n_layer, n_embd, (0, n_layer))
            except SteeringError as e:
                log.warning("steering vector %r cannot be used: %s", name, e)
                unusable[name] = str(e)
                continue
            dirs[name] = steering.dirs
        return cls(dirs, unusable)

    @property
    def names(self) -> list[str]:
        return sorted(self._dirs)

    def resolve(self, choice: SteeringChoice) -> Steering | None:
        """The steering a request chose (None: unsteered); PromptRefused (a 400 naming
        the field) for a name this model does not have. Blocking (a copy and a digest of
        the directions): run it where the prompt is prepared."""
        if choice.name == STEERING_OFF:
            return None
        with self._lock:
            if choice in self._resolved:
                return self._resolved[choice]
        base = self._dirs.get(choice.name)
        if base is None:
            why = self._unusable.get(choice.name)
            if why is not None:
                raise PromptRefused(f"steering vector {choice.name!r} cannot be used: {why}",
                                    PARAM)  # fmt: skip
            known = ", ".join([*self.names, STEERING_OFF])
            raise PromptRefused(
                f"unknown steering vector {choice.name!r} (this model has: {known})", PARAM
            )
        dirs = base * np.float32(choice.scale)
        if choice.layers is not None:
            first, last = choice.layers
            keep = np.zeros(len(dirs), bool)
            keep[first : last + 1] = True
            dirs[~keep] = 0.0
        attn = 0.0 if choice.attn is None else choice.attn
        ffn = 1.0 if choice.ffn is None else choice.ffn
        made = Steering(dirs, attn, ffn, source=f"{choice.name}×{choice.scale:g}")
        # scale 0, or no direction in the range: exactly unsteered
        steering = made if made.active else None
        with self._lock:
            if len(self._resolved) >= _RESOLVED_KEEP:
                self._resolved.pop(next(iter(self._resolved)))
            self._resolved[choice] = steering
        return steering
