"""Speculative decoding that changes no output: drafts verified in one pass.

At a decode step a request with speculation on drafts up to k tokens after its pending
token, from the text it has seen (prompt lookup: ds4d.serving.lookup) or from a small
model of the same vocabulary (ds4d.serving.draft), and evaluates them as one chunk in the step's
batched call (`Engine.eval_batch` with rows: every row's logits; `verify` does it alone):
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
- A draft model's sampled draft is not a point mass: its tokens are drawn from the draft's
  distribution q, and `RatioDraw` applies the standard rule (keep d with probability
  min(1, p(d) / q(d)), else draw from max(0, p - q) renormalised), whose output is
  distributed as p exactly. It draws differently from a plain step, so a seeded request's
  tokens are then the same in distribution, not token for token; a greedy request's
  draft is the draft's argmax, a point mass, and its tokens stay identical.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Literal

import numpy as np

from ds4d.chat.types import Event
from ds4d.engine.engine import Session
from ds4d.engine.sampler import SamplingParams, distribution, sample
from ds4d.serving.draft import DraftModel
from ds4d.serving.lookup import DraftLength, PromptLookup
from ds4d.serving.stepcost import StepCost

if TYPE_CHECKING:
    from ds4d.serving.decoding import DecodeStep, Decoding

SpeculativeMode = Literal["off", "lookup", "draft"]
MODES: tuple[SpeculativeMode, ...] = ("off", "lookup", "draft")

# Rows of one verification chunk (the pending token and the drafts): DS4N_DEC_SMALL_T in
# native/decoder.h, the most rows whose logits are bitwise token-by-token decode's.
VERIFY_ROWS = 8
MAX_DRAFT = VERIFY_ROWS - 1

# The most tokens a draft session may lack and still draft (it evaluates them first): the
# last step's (the accepted draft's last token). A draft session further behind (a new
# prompt, tokens generated without it) is brought up by the engine loop's prefill work
# (`model_catch_up`), and meanwhile the request does not draft.
FOLLOW_TOKENS = 2


class Speculation:
    """One request's drafts: its prompt lookup or draft model, its draft length, and what
    they did. `seed` is the request's: a draft model's sampled drafts are drawn from a
    generator of their own, derived from it (the request's own draws stay its own).

    With a draft model, the model drafts while its length (`model_length`: its own
    acceptance rate and the measured costs) pays and its session is caught up; otherwise
    the step is plain. The draft model's figures stay its own: a request with a draft
    model never drafts by prompt lookup (`length` is lookup's rate, for requests without
    one)."""

    def __init__(self, max_draft: int = MAX_DRAFT, model: DraftModel | None = None,
                 seed: int | None = None, cost: StepCost | None = None) -> None:  # fmt: skip
        self.max_draft = min(max_draft, MAX_DRAFT)
        self.length = DraftLength(self.max_draft)  # prompt lookup's
        self.model_length = DraftLength(self.max_draft)  # the draft model's
        self.model = model
        self.cost = cost  # the served model's measured step costs (None: the rate alone)
        self._rng = np.random.default_rng(None if seed is None else [seed, DRAFT_STREAM])
        self._qs: list[np.ndarray] | None = None  # the last draft's distributions
        self._lookup: PromptLookup | None = None
        self._by_model = False  # whether the last draft was the draft model's
        self.drafted = 0
        self.accepted = 0

    def draft(self, decoding: Decoding, step: DecodeStep, limit: int) -> list[int]:
        """The tokens to verify after the decoding's pending token (engine thread: the
        prompt is indexed, or the draft session synced, here), at most `limit`; [] for a
        plain step."""
        self._qs = None
        self._by_model = False
        if not decoding.pending or limit <= 0:
            return []
        if self.model is not None:
            if self.model.behind(decoding.session) > FOLLOW_TOKENS:
                return []
            k = min(self.model_length.next(self.cost, drafting=True), limit, self.max_draft)
            if k <= 0:
                return []
            proposal = self.model.propose(decoding.session, decoding.pending[0], k,
                                          step.params, step.allowed, self._rng)  # fmt: skip
            if self.cost is not None:
                self.cost.observe_draft(proposal.passes, proposal.pass_s)
                self.cost.observe_catch_up(proposal.caught_up, proposal.catch_up_s)
            self._qs = proposal.qs
            self._by_model = True
            return proposal.tokens
        k = min(self.length.next(self.cost), limit, self.max_draft)
        if k <= 0:
            return []
        lookup = self._lookup
        if lookup is None:
            lookup = self._lookup = PromptLookup(decoding.session.tokens[: decoding.n_prompt])
        lookup.extend(decoding.output_ids[len(lookup) - decoding.n_prompt :])
        return lookup.propose(k)

    def draw(self) -> Draw:
        """The acceptance rule of the last draft: the ratio rule for a draft drawn from
        distributions, else the point-mass rule."""
        return RatioDraw(self._qs) if self._qs is not None else exact_draw

    def model_catch_up(self, session: Session) -> int:
        """How many tokens the draft session should catch up with as prefill work: those it
        lacks, when more than it evaluates at a drafting step and its draft model would
        draft now (its length pays, or a probe does, the catching up counted); else 0."""
        if self.model is None or self.model_length.next(self.cost, drafting=True) <= 0:
            return 0
        behind = self.model.behind(session)
        return behind if behind > FOLLOW_TOKENS else 0

    def observe(self, drafted: int, accepted: int) -> None:
        self.drafted += drafted
        self.accepted += accepted
        if drafted == 0:  # a plain step: neither drafted
            self.length.observe(0, 0)
            self.model_length.observe(0, 0)
        elif self._by_model:
            self.model_length.observe(drafted, accepted)
        else:  # prompt lookup's (a request without a draft model)
            self.length.observe(drafted, accepted)


# Mixed into a seeded request's seed for its draft model's own generator.
DRAFT_STREAM = 0x5D4AF7

# The draw at a verification chunk's position i: (i, logits, params, the request's
# generator, the allowed ids, the drafted token there or -1) -> the token generated there.
# The draft is kept when it equals it.
Draw = Callable[[int, np.ndarray, SamplingParams, np.random.Generator, np.ndarray | None, int], int]


def exact_draw(i: int, logits: np.ndarray, params: SamplingParams, rng: np.random.Generator,
               allowed: np.ndarray | None, drafted: int) -> int:  # fmt: skip
    """The point-mass rule: the token is sampled as a plain step samples it, whatever
    was drafted (see the module's docstring for why that is the acceptance rule)."""
    return sample(logits, params, rng, allowed)


class RatioDraw:
    """The speculative-sampling rule for drafts drawn from distributions q (qs[i]: that
    of the token drafted after position i): keep the drafted d with probability
    min(1, p(d) / q(d)), else draw from the residual max(0, p - q) renormalised; p is the
    target's distribution under the request's parameters (ds4d.engine.sampler.distribution).
    Whatever q is, the token generated is distributed as p. Past the drafts (the last row)
    the token is sampled as a plain step samples it."""

    def __init__(self, qs: list[np.ndarray]) -> None:
        self.qs = qs

    def __call__(self, i: int, logits: np.ndarray, params: SamplingParams,
                 rng: np.random.Generator, allowed: np.ndarray | None,
                 drafted: int) -> int:  # fmt: skip
        if drafted < 0 or i >= len(self.qs):
            return sample(logits, params, rng, allowed)
        p = distribution(logits, params, allowed)
        if p is None:  # an infill rule: the draft model drafts greedily for it
            raise ValueError("no distribution to accept a sampled draft against")
        q = self.qs[i]
        if rng.random() * q[drafted] < p[drafted]:
            return drafted
        residual = np.maximum(p - q, 0.0)
        cum = np.cumsum(residual)
        if cum[-1] <= 0.0:  # p == q up to rounding: the draft is (almost surely) kept above
            return sample(logits, params, rng, allowed)
        t = int(np.searchsorted(cum, rng.random() * cum[-1], side="right"))
        if t >= residual.size or residual[t] == 0.0:  # rounding at the end
            t = int(np.flatnonzero(residual)[-1])
        return t


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
        token = draw(i, rows[i], params, decoding.rng, allowed, drafted)
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
