"""llama.cpp's `infill` sampler rule (llama-sampler.cpp), for code completion.

It runs on the candidates the earlier filters left (top_k, top_p, min_p at temperature
1), and narrows them to what a completion should draw from:

- when the end-of-generation tokens hold much of the mass (3 * p_eog * n > p_text), only
  they remain: the model thinks the gap is filled;
- otherwise a candidate whose text starts another's gives that one its probability (the
  likelier of the two keeps the sum), candidates under 0.2 go, then those under
  1 / (kept + 1) of what is left; end-of-generation tokens always stay;
- no text candidate left: the end-of-turn token (else end-of-sequence) alone.

The draw (with the request's temperature) is then made among the survivors' logits, as
llama.cpp's dist sampler does after it.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from ds4d.engine.tokenizer_api import ModelTokenizer

MERGE_CANDIDATES = 256  # the pairwise merge is quadratic: without top_k, the best 256


@dataclass(frozen=True)
class InfillRule:
    is_eog: Callable[[int], bool]
    piece: Callable[[int], bytes]  # a token's text; b"" for control tokens
    end_id: int  # what a completion with nothing left to say ends with

    def candidates(self, logits: np.ndarray, top_k: int, top_p: float, min_p: float) -> np.ndarray:
        """The token ids left to draw from."""
        values = np.asarray(logits, dtype=np.float32)
        k = top_k if 0 < top_k < values.size else min(MERGE_CANDIDATES, values.size)
        ids = np.argpartition(-values, k - 1)[:k] if k < values.size else np.arange(values.size)
        ids = ids[np.argsort(-values[ids], kind="stable")]
        ids = ids[np.isfinite(values[ids])]
        if ids.size == 0:
            return np.array([self.end_id])
        p = _softmax(values[ids])
        if top_p < 1:
            keep = int(np.searchsorted(np.cumsum(p), top_p)) + 1
            ids, p = ids[:keep], p[:keep]
        if min_p > 0:
            keep_mask = p >= p[0] * min_p
            ids = ids[keep_mask]
        p = _softmax(values[ids])
        return np.asarray(self._narrow(ids.tolist(), p.tolist()), dtype=np.int64)

    def _narrow(self, ids: list[int], p: list[float]) -> list[int]:
        eog = [self.is_eog(i) for i in ids]
        p_eog = sum(q for q, e in zip(p, eog, strict=True) if e)
        p_txt = sum(q for q, e in zip(p, eog, strict=True) if not e)
        if 3 * p_eog * len(ids) > p_txt:
            return [i for i, e in zip(ids, eog, strict=True) if e]
        pieces = [self.piece(i) for i in ids]
        alive = [True] * len(ids)
        for a in range(len(ids)):
            for b in range(len(ids)):
                if not alive[a]:
                    break
                if a == b or not alive[b]:
                    continue
                pa, pb = pieces[a], pieces[b]
                if pa and len(pa) <= len(pb) and pb.startswith(pa):
                    dst, src = (b, a) if p[b] > p[a] else (a, b)
                    p[dst] += p[src]
                    p[src] = 0.0
                    alive[src] = False
        kept = [j for j in range(len(ids)) if alive[j] and (p[j] >= 0.2 or eog[j])]
        n_text = sum(1 for j in kept if not eog[j])
        if n_text == 0:
            return [self.end_id]
        total = sum(p[j] for j in kept)
        threshold = 1.0 / (n_text + 1)
        return [ids[j] for j in kept if p[j] / total >= threshold or eog[j]]


def _softmax(values: np.ndarray) -> np.ndarray:
    e = np.exp(values.astype(np.float64) - values.max())
    out: np.ndarray = e / e.sum()
    return out


def infill_rule_for(tok: ModelTokenizer) -> InfillRule | None:
    """The rule over a tokenizer's vocabulary; None when it has no token to end with."""
    end = tok.eos_id if tok.eos_id is not None else min(tok.eog_ids, default=None)
    if end is None:
        return None

    def piece(token_id: int) -> bytes:
        return b"" if tok.is_special(token_id) else tok.token_bytes(token_id)

    return InfillRule(tok.is_eog, piece, end)
