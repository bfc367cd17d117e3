"""Resident KV slots: one live engine Session plus bookkeeping. How a slot's session comes
to hold a new prompt is ds4d.state.sync; which slot a prompt goes to, the engine loop's
slot pool (ds4d.serving.slots)."""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from ds4d.engine.engine import Session
from ds4d.state.recent import RecentStates


@dataclass
class Slot:
    index: int
    session: Session
    ctx: int
    busy: bool = False
    last_used: float = field(default_factory=time.monotonic)
    requests: int = 0
    # the slot's recent completion states (None: none kept)
    recent: RecentStates | None = None

    @property
    def tokens(self) -> Sequence[int]:
        return self.session.tokens

    def describe(self) -> dict[str, Any]:
        return {
            "id": self.index,
            "state": "busy" if self.busy else "idle",
            "tokens": self.session.n_tokens,
            "ctx": self.ctx,
            "requests": self.requests,
            "idle_s": 0.0 if self.busy else round(time.monotonic() - self.last_used, 1),
        }
