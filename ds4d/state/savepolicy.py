"""When a session is worth a disk checkpoint, and at which token count.

Pure arithmetic over token counts; the daemon asks, then saves only when the live
session is exactly at the answered length — a session is never rolled back to make an
entry.

* cold: a complete miss prefills a long prompt in two steps, prefix -> save -> rest. The
  prefix ends at the chat anchor when the caller knows one, else at the prompt length
  with a small tail trimmed (the last tokens may re-tokenize differently once the next
  turn is appended) and aligned down to a multiple of `align_tokens`.
* continued: as a session grows, at absolute multiples of the continued step.
"""

from __future__ import annotations

import math
from dataclasses import dataclass


@dataclass(frozen=True)
class SavePolicy:
    min_tokens: int = 512
    cold_max_tokens: int = 30000  # 0 disables cold saves
    continued_interval_tokens: int = 10000  # 0 disables continued saves
    boundary_trim_tokens: int = 32
    boundary_align_tokens: int = 2048  # 0 disables alignment

    def __post_init__(self) -> None:
        if self.min_tokens <= 0:
            raise ValueError("kv-cache-min-tokens must be > 0")
        if self.cold_max_tokens and self.cold_max_tokens < self.min_tokens:
            raise ValueError("kv-cache-cold-max-tokens must be 0 or >= kv-cache-min-tokens")
        for name in ("continued_interval_tokens", "boundary_trim_tokens", "boundary_align_tokens"):
            if getattr(self, name) < 0:
                raise ValueError(f"{name.replace('_', '-')} must be >= 0")

    @classmethod
    def for_context(cls, n_ctx: int, **overrides: int | None) -> SavePolicy:
        """Defaults scaled to the loaded model's context; None overrides are ignored.

        ds4's values (512 / 30000 / 10000 / 32 / 2048) suit a 32k+ context. For a smaller
        one, alignment and the continued interval shrink so a prompt that fills most of
        the context still gets a checkpoint covering >90% of it."""
        align = 2048
        while align > 64 and align * 32 > n_ctx:
            align //= 2
        values = dict(
            min_tokens=min(512, max(16, n_ctx // 16)),
            cold_max_tokens=min(30000, n_ctx),
            continued_interval_tokens=min(10000, max(align, n_ctx // 4)),
            boundary_trim_tokens=32,
            boundary_align_tokens=align,
        )
        values.update({k: v for k, v in overrides.items() if v is not None})
        return cls(**values)

    @property
    def continued_step(self) -> int:
        """Spacing of continued frontiers: the interval rounded up to the alignment."""
        if not self.continued_interval_tokens:
            return 0
        align = self.boundary_align_tokens
        if not align:
            return self.continued_interval_tokens
        return math.ceil(self.continued_interval_tokens / align) * align

    def store_len(self, n: int) -> int:
        """Trimmed, aligned prefix length of an n-token prompt (n itself if too short)."""
        if n <= self.min_tokens + self.boundary_trim_tokens:
            return n
        s = n - self.boundary_trim_tokens
        if self.boundary_align_tokens:
            s -= s % self.boundary_align_tokens
        return s if s >= self.min_tokens else n

    def cold_boundary(self, n_prompt: int, cached: int, anchor: int | None = None) -> int | None:
        """Token count at which to save a cold checkpoint of an n-token prompt, or None.

        Only complete misses (`cached == 0`) of prompts within [min, cold_max] qualify;
        `anchor` (end of the stable head of a chat, e.g. right before the last user turn
        preceding the first assistant turn) wins when it is long enough."""
        if cached or not self.cold_max_tokens:
            return None
        if not self.min_tokens <= n_prompt <= self.cold_max_tokens:
            return None
        if anchor is not None and self.min_tokens <= anchor <= n_prompt:
            return anchor
        return self.store_len(n_prompt)

    def continued_due(self, live_len: int, last_stored: int) -> bool:
        """Is `live_len` a continued frontier that has not been stored yet?"""
        step = self.continued_step
        return (
            step > 0
            and live_len >= self.min_tokens
            and live_len % step == 0
            and live_len > last_stored
        )

    def next_continued(self, after: int) -> int | None:
        """The first continued frontier strictly above `after` (None when disabled), so a
        chunked prefill can stop there, save and go on."""
        step = self.continued_step
        if not step:
            return None
        frontier = (after // step + 1) * step
        while frontier < self.min_tokens:
            frontier += step
        return frontier

    def worth_saving(self, n_tokens: int) -> bool:
        """Evict and shutdown saves: the whole live session, if long enough."""
        return n_tokens >= self.min_tokens
