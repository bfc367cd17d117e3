"""Speculative decoding that changes no output: prompt-lookup drafts verified in one pass.

At a decode step a request with speculation on drafts up to k tokens (ds4d.serving.lookup)
after its pending token and evaluates them as one chunk with `Session.eval_all_logits`:
row i holds the logits after the chunk's token i. Then, position by position, the token
is sampled from that row exactly as a plain step would sample it (the same sampler, the
request's own generator, the constraint's allowed ids at that point) and fed to the
request's output pipeline; while it equals the next drafted token, that token is already
evaluated and the next row is read; the first mismatch (or the end of the drafts: the
model's own next token) ends the step, and the KV of the drafted tokens not kept is
rewound.

Why nothing changes:

- The chunk's per-position logits are bitwise those of token-by-token decode as long as
  the chunk has at most VERIFY_ROWS tokens: the native forward pass evaluates up to
  DS4N_DEC_SMALL_T (native/decoder.h) rows with the small-batch matvec, each row bitwise
  the single-token product; longer chunks take the blocked prefill matmul, whose sums
  differ in the last bits (measured: docs/speculative.md). Drafts are capped to fit.
- Every generated token is one `sample` call on those logits, as without speculation, so
  a greedy request's tokens are identical and a seeded request draws the same numbers in
  the same order: its tokens are identical too. For a draft token d this is the standard
  speculative-sampling rule for a point-mass proposal (accept d with probability p(d),
  else draw from p with d removed, renormalised): drawing t ~ p and keeping d when t == d
  gives d with probability p(d) and any other token with probability p(t), the same
  distribution, drawn with the request's one generator.
- A token the pipeline does not evaluate (an end-of-generation token) is never kept in
  the session, a forced piece of a tool call ends the verification (the next step forces
  it), a drafted token outside the constraint's allowed ids is simply never sampled, and
  the session is rewound to the accepted tokens before any checkpoint is taken; a chunk
  never steps over a continued-checkpoint frontier, so the same checkpoints are written.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Literal

import numpy as np

from ds4d.chat.types import Event
from ds4d.engine.engine import Session
from ds4d.engine.sampler import SamplingParams, sample
from ds4d.serving.lookup import DraftLength, PromptLookup

if TYPE_CHECKING:
    from ds4d.serving.decoding import DecodeStep, Decoding

SpeculativeMode = Literal["off", "lookup"]
MODES: tuple[SpeculativeMode, ...] = ("off", "lookup")

# Rows of one verification chunk (the pending token and the drafts): DS4N_DEC_SMALL_T in
# native/decoder.h, the most rows whose logits are bitwise token-by-token decode's.
VERIFY_ROWS = 8
MAX_DRAFT = VERIFY_ROWS - 1


class Speculation:
    """One request's drafts: its prompt lookup and draft length, and what they did."""

    def __init__(self, max_draft: int = MAX_DRAFT) -> None:
        self.max_draft = min(max_draft, MAX_DRAFT)
        self.length = DraftLength(self.max_draft)
        self._lookup: PromptLookup | None = None
        self.drafted = 0
        self.accepted = 0

    def draft(self, decoding: Decoding, limit: int) -> list[int]:
        """The tokens to verify after the decoding's pending token (engine thread: the
        prompt is indexed on first use), at most `limit`; [] for a plain step."""
        k = min(self.length.next(), limit, self.max_draft)
        if k <= 0 or not decoding.pending:
            return []
        lookup = self._lookup
        if lookup is None:
            lookup = self._lookup = PromptLookup(decoding.session.tokens[: decoding.n_prompt])
        lookup.extend(decoding.output_ids[len(lookup) - decoding.n_prompt :])
        return lookup.propose(k)

    def observe(self, drafted: int, accepted: int) -> None:
        self.drafted += drafted
        self.accepted += accepted
        self.length.observe(drafted, accepted)


# The draw at a drafted position: (logits, params, the request's generator, the allowed ids,
# the drafted token) -> the token generated there. The draft is kept when it equals it.
Draw = Callable[[np.ndarray, SamplingParams, np.random.Generator, np.ndarray | None, int], int]


def exact_draw(logits: np.ndarray, params: SamplingParams, rng: np.random.Generator,
               allowed: np.ndarray | None, drafted: int) -> int:  # fmt: skip
    """The point-mass rule: the token is sampled as a plain step samples it, whatever
    was drafted (see the module's docstring for why that is the acceptance rule)."""
    return sample(logits, params, rng, allowed)


@dataclass
class Verified:
    events: list[Event]
    drafted: int
    accepted: int
    keep: int  # of the chunk's tokens, how many the session keeps


def verify(decoding: Decoding, session: Session, step: DecodeStep, draft: list[int],
           draw: Draw = exact_draw) -> Verified:  # fmt: skip
    """Evaluates the step's pending token and `draft` in one chunk and generates from it,
    as token-by-token steps would (engine thread). The session keeps the accepted tokens."""
    chunk = step.tokens + draft
    if not (step.sample and len(step.tokens) == 1 and draft and len(chunk) <= VERIFY_ROWS):
        raise ValueError(f"not a verification step: {len(chunk)} tokens, sample {step.sample}")
    n0 = session.n_tokens
    rows = session.eval_all_logits(chunk)
    verified = accept(decoding, step, chunk, rows, draw)
    session.rewind(n0 + verified.keep)
    return verified


def accept(decoding: Decoding, step: DecodeStep, chunk: list[int], rows: np.ndarray,
           draw: Draw = exact_draw) -> Verified:  # fmt: skip
    """The tokens generated from a verification chunk's logits (`rows[i]`: after
    `chunk[i]`), fed to the decoding's output pipeline; how many of the chunk to keep."""
    events: list[Event] = []
    params, allowed = step.params, step.allowed
    accepted = 0
    i = 0
    while True:
        keep = i + 1  # chunk[:keep] stays in the session
        drafted = chunk[keep] if keep < len(chunk) else -1
        token = draw(rows[i], params, decoding.rng, allowed, drafted)
        events += decoding.after(token)
        if decoding.done or decoding.pending != [token]:
            break  # nothing more to evaluate (an end-of-generation token is never kept)
        if token != drafted:
            break  # the model's own token is pending: the next step evaluates it
        decoding.evaluated()  # the drafted token was right and is evaluated already
        accepted += 1
        keep += 1
        nxt = None if decoding.done else decoding.sampling_next()
        if nxt is None:
            break
        params, allowed = nxt
        i += 1
    return Verified(events, len(chunk) - 1, accepted, keep)
