"""Next-token sampling: temperature, top_k, top_p, min_p, seed.

The filters run in llama.cpp's default order: top_k -> top_p -> min_p -> temperature ->
draw. top_p and min_p therefore judge probabilities at temperature 1; temperature only
reshapes the draw among the survivors. Temperature 0 is greedy (argmax).

With top_k or top_p on, the filters and the draw run natively (ds4n_sample: a heap for the
k best, a first look at the 64 best for the nucleus, a radix sort of a nucleus of thousands,
no per-token allocation), 2-4x faster than numpy's argpartition and argsort there; without them numpy's
vectorised exp is as fast, and the draw stays here.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from ds4d.engine import native
from ds4d.engine.infill_sampling import InfillRule

_DRAW_BLOCK = 1024
# The draw runs in float32. A top_p or temperature that is positive as a Python float may
# round to 0 (or overflow) there; such values act as their limit: below float32's range
# a temperature is greedy and a top_p keeps the best token alone, and above it a
# temperature is as flat as float32's largest.
_F32_TINIEST = float(np.finfo(np.float32).smallest_subnormal)
_F32_MAX = float(np.finfo(np.float32).max)


@dataclass(frozen=True)
class SamplingParams:
    temperature: float = 1.0  # 0 = greedy
    top_k: int = 0  # 0 = off
    top_p: float = 1.0  # 1 = off
    min_p: float = 0.0  # 0 = off
    seed: int | None = None  # None = fresh entropy
    # llama.cpp's infill rule after the filters (ds4d.engine.infill_sampling), or None
    infill: InfillRule | None = None

    def __post_init__(self) -> None:
        def real(name: str, value: object) -> float:
            if isinstance(value, bool) or not isinstance(value, (int, float)):
                raise ValueError(f"{name} must be a number, got {value!r}")
            if not math.isfinite(value):
                raise ValueError(f"{name} must be finite, got {value!r}")
            return float(value)

        if real("temperature", self.temperature) < 0:
            raise ValueError(f"temperature must be >= 0, got {self.temperature!r}")
        if isinstance(self.top_k, bool) or not isinstance(self.top_k, int) or self.top_k < 0:
            raise ValueError(f"top_k must be an integer >= 0, got {self.top_k!r}")
        if not 0 < real("top_p", self.top_p) <= 1:
            raise ValueError(f"top_p must be in (0, 1], got {self.top_p!r}")
        if not 0 <= real("min_p", self.min_p) <= 1:
            raise ValueError(f"min_p must be in [0, 1], got {self.min_p!r}")
        if self.seed is not None and (
            isinstance(self.seed, bool) or not isinstance(self.seed, int) or self.seed < 0
        ):
            raise ValueError(f"seed must be an integer >= 0 or None, got {self.seed!r}")

    @property
    def greedy(self) -> bool:
        return self.temperature <= _F32_TINIEST / 2 or self.top_k == 1  # 0.0f in float32


def make_rng(seed: int | None = None) -> np.random.Generator:
    """The generator ``sample`` draws from: reproducible for a seed, fresh for None."""
    return np.random.default_rng(seed)


def sample(
    logits: np.ndarray,
    params: SamplingParams,
    rng: np.random.Generator,
    allowed: np.ndarray | None = None,
) -> int:
    """Pick the next token id from ``logits`` (shape ``(n_vocab,)``).

    ``allowed`` restricts the choice to a subset of the vocabulary: a boolean mask of
    length n_vocab or an array of token ids. Each non-greedy call draws exactly one
    number from ``rng``.
    """
    logits = np.asarray(logits)
    if logits.ndim != 1 or logits.size == 0:
        raise ValueError(f"logits must be a non-empty 1-D array, got shape {logits.shape}")
    if params.infill is not None and allowed is None and not params.greedy:
        # the filters and the infill rule pick the candidates; the draw is among them
        survivors = params.infill.candidates(logits, params.top_k, params.top_p, params.min_p)
        draw = SamplingParams(temperature=params.temperature, seed=params.seed)
        return sample(logits, draw, rng, survivors)
    ids = _allowed_ids(allowed, logits.size)
    # float32 throughout: exp is an order of magnitude faster than in float64, and
    # sums are taken in float64.
    values = (logits if ids is None else logits[ids]).astype(np.float32, copy=False)

    temperature = min(params.temperature, _F32_MAX)
    if not params.greedy and (0 < params.top_k < values.size or params.top_p < 1):
        # ds4n_sample takes numpy's argmax itself (a non-finite best is the answer), in
        # the same pass over the logits as its top_k; the draw still consumes u.
        top_p = max(params.top_p, _F32_TINIEST)
        pick = native.sample(np.ascontiguousarray(values), params.top_k, top_p,
                             params.min_p, temperature, rng.random())  # fmt: skip
        return _token(ids, pick)

    best = int(np.argmax(values))
    if params.greedy or not math.isfinite(values[best]):
        return _token(ids, best)

    # Candidates as positions into `values`; None means all of them.
    keep: np.ndarray | None = None
    if params.min_p > 0:
        keep = np.flatnonzero(values >= values[best] + np.float32(math.log(params.min_p)))

    chosen = values if keep is None else values[keep]
    weights = np.exp((chosen - values[best]) / np.float32(temperature))
    pick = _draw(weights, rng.random())
    return _token(ids, pick if keep is None else int(keep[pick]))


def _allowed_ids(allowed: np.ndarray | None, n_vocab: int) -> np.ndarray | None:
    if allowed is None:
        return None
    allowed = np.asarray(allowed)
    if allowed.dtype == np.bool_:
        if allowed.shape != (n_vocab,):
            raise ValueError(f"allowed mask must have shape ({n_vocab},), got {allowed.shape}")
        ids = np.flatnonzero(allowed)
    elif np.issubdtype(allowed.dtype, np.integer):
        ids = allowed.reshape(-1)
        if ids.size and (ids.min() < 0 or ids.max() >= n_vocab):
            raise ValueError(f"allowed token ids must be in [0, {n_vocab})")
    else:
        raise ValueError(f"allowed must be a boolean mask or token ids, got {allowed.dtype}")
    if ids.size == 0:
        raise ValueError("allowed selects no token")
    return ids


def _token(ids: np.ndarray | None, position: int) -> int:
    return position if ids is None else int(ids[position])


def _draw(weights: np.ndarray, u: float) -> int:
    """The index whose cumulative-weight interval holds ``u`` x total (u in [0, 1)).

    Two levels (block sums, then one block's running sum) instead of one running sum
    over the whole vocabulary, which numpy computes serially."""
    starts = np.arange(0, weights.size, _DRAW_BLOCK)
    block_mass = np.cumsum(np.add.reduceat(weights, starts, dtype=np.float64))
    target = u * block_mass[-1]
    b = min(int(np.searchsorted(block_mass, target, side="right")), starts.size - 1)
    block = weights[starts[b] : starts[b] + _DRAW_BLOCK]
    inner = np.cumsum(block, dtype=np.float64)
    i = int(np.searchsorted(inner, target - (block_mass[b - 1] if b else 0.0), side="right"))
    if i >= block.size or block[i] == 0:  # rounding at the block's end
        i = int(np.flatnonzero(block)[-1])
    return int(starts[b]) + i


def distribution(
    logits: np.ndarray, params: SamplingParams, allowed: np.ndarray | None = None
) -> np.ndarray | None:
    """The probabilities ``sample`` draws from (float64, n_vocab, summing to 1): the same
    filters in the same order (top_k with ties to the lower position, the top_p nucleus at
    temperature 1, min_p, then the temperature). The weights are numpy's exponentials, a
    few ulp from the native draw's. None for an infill rule, whose candidates this does
    not rebuild. Speculative sampling's acceptance rule needs the whole distribution of
    both the target and the draft (ds4d.serving.speculation)."""
    logits = np.asarray(logits)
    if logits.ndim != 1 or logits.size == 0:
        raise ValueError(f"logits must be a non-empty 1-D array, got shape {logits.shape}")
    if params.infill is not None and allowed is None and not params.greedy:
        return None
    ids = _allowed_ids(allowed, logits.size)
    values = (logits if ids is None else logits[ids]).astype(np.float32, copy=False)
    out = np.zeros(logits.size, np.float64)
    if params.greedy or np.isnan(values).any() or not np.isfinite(values.max()):
        out[_token(ids, int(np.argmax(values)))] = 1.0
        return out
    # the candidates, as positions into `values`
    k = params.top_k
    if 0 < k < values.size:  # the k best, ties to the lower position
        kth = np.partition(values, values.size - k)[values.size - k]
        above = np.flatnonzero(values > kth)
        pos = np.concatenate([above, np.flatnonzero(values == kth)[: k - above.size]])
    else:
        pos = np.arange(values.size)
    best = values[pos].max()
    if params.top_p < 1:
        # the smallest best-first prefix reaching top_p of the mass; it lies among the
        # candidates weighing at least tau (those below weigh less than 1 - top_p together)
        w = np.exp((values[pos] - best).astype(np.float64))
        top_p = max(params.top_p, _F32_TINIEST)
        target = top_p * w.sum()
        near = w >= (1.0 - top_p) * w.sum() / pos.size
        pos, w = pos[near], w[near]
        order = np.lexsort((pos, -values[pos]))
        pos, mass = pos[order], np.cumsum(w[order])
        pos = pos[: min(int(np.searchsorted(mass, target, side="left")) + 1, pos.size)]
    if params.min_p > 0:
        pos = pos[values[pos] >= best + np.float32(math.log(params.min_p))]
    temperature = min(params.temperature, _F32_MAX)
    weights = np.exp((values[pos] - best).astype(np.float64) / temperature)
    out[pos if ids is None else ids[pos]] = weights / weights.sum()
    return out
