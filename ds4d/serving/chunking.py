"""Prefill chunk sizes measured in engine time, not tokens.

A prefill chunk is one engine call that nothing can interrupt: a request arriving while
it runs waits for it, and a slot that is generating stalls for it. So every chunk is
sized to take about `target_s` of engine time at the speed the engine has shown: the
speed falls as the context deepens (attention reads every row before the chunk's), so
the cost of a token is fitted as a line in its depth over the last chunks of any slot
(followed deeper than the chunks seen, not shallower), and the next chunk of a session at
depth d gets `target_s / cost(d)` tokens, within [`min_tokens`, `max_tokens`]. Below
about 64 tokens a chunk spends noticeably more engine time per token (the weights are
decoded for fewer rows at a time), hence the floor. A prompt's last piece is not split
off when it is under half a chunk (a short request's prompt is one call, not two waits),
as long as the whole stays within `max_tokens`: a size this gives is one C call
(`max_tokens` is at most the engine's PREFILL_CHUNK), so the time it is observed to take
is the time of one call.

Pure arithmetic over the (depth, tokens, seconds) it is told: the engine loop
(ds4d.serving.loop) times each chunk with its clock.
"""

from __future__ import annotations

from collections import deque

from ds4d.engine.engine import PREFILL_CHUNK

TARGET_S = 0.25  # engine time of one chunk: the longest stall another slot sees
MIN_TOKENS = 32
MAX_TOKENS = PREFILL_CHUNK  # one C call
FIRST_TOKENS = 64  # before anything was measured
HISTORY = 32  # chunks the fit looks back on
MIN_SPREAD = 512  # depth range below which the fit is a mean, not a line


class ChunkSizer:
    def __init__(self, target_s: float = TARGET_S, min_tokens: int = MIN_TOKENS,
                 max_tokens: int = MAX_TOKENS, first_tokens: int = FIRST_TOKENS) -> None:  # fmt: skip
        if not 0 < min_tokens <= first_tokens <= max_tokens <= PREFILL_CHUNK:
            raise ValueError(f"chunk sizes need 0 < min <= first <= max <= {PREFILL_CHUNK}")
        if target_s <= 0:
            raise ValueError("the chunk time target must be positive")
        self.target_s = target_s
        self.min_tokens = min_tokens
        self.max_tokens = max_tokens
        self.first_tokens = first_tokens
        # (mean depth of the chunk's tokens, seconds per token)
        self._seen: deque[tuple[float, float]] = deque(maxlen=HISTORY)

    def observe(self, depth: int, tokens: int, seconds: float) -> None:
        """A chunk of `tokens` tokens evaluated after `depth` held ones took `seconds`."""
        if tokens <= 0 or seconds <= 0:
            return
        self._seen.append((depth + tokens / 2, seconds / tokens))

    def cost(self, depth: float) -> float | None:
        """Seconds per token at `depth`, from the chunks seen (None before any)."""
        if not self._seen:
            return None
        n = len(self._seen)
        mx = sum(d for d, _ in self._seen) / n
        my = sum(c for _, c in self._seen) / n
        depths = [d for d, _ in self._seen]
        if max(depths) - min(depths) < MIN_SPREAD:
            return my
        sxx = sum((d - mx) ** 2 for d, _ in self._seen)
        sxy = sum((d - mx) * (c - my) for d, c in self._seen)
        slope = max(0.0, sxy / sxx)  # deeper is never cheaper; noise may say otherwise
        # Above the depths seen the line goes on (longer attention: smaller chunks); below
        # them it is not followed down (a noisy slope would promise cheap tokens and
        # a chunk far over the target): the cost at the shallowest depth seen stands.
        return my + slope * (max(depth, min(depths)) - mx)

    def size(self, depth: int, remaining: int | None = None) -> int:
        """Tokens for the next chunk of a session holding `depth` tokens, `remaining` more
        to go: a tail of less than half a chunk is not left for a call of its own."""
        cost = self.cost(depth)
        if cost is None:
            n = self.first_tokens
        else:
            guess = self.target_s / cost
            cost = self.cost(depth + guess / 2)  # its tokens sit deeper on average
            assert cost is not None
            n = max(self.min_tokens, min(self.max_tokens, round(self.target_s / cost)))
        if remaining is not None and remaining - n < n // 2:
            return min(remaining, self.max_tokens)
        return n
