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

from dataclasses import dataclass
from typing import TYPE_CHECKING, Literal

from ds4d.chat.types import Event
from ds4d.engine.engine import Session
from ds4d.engine.sampler import sample
from ds4d.serving.lookup import DraftLength, PromptLookup

if TYPE_CHECKING:
    from ds4d.serving.decoding import Decoding, DecodeStep

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


@dataclass
class Verified:
    events: list[Event]
    drafted: int
    accepted: int


def verify(decoding: Decoding, session: Session, step: DecodeStep, draft: list[int]) -> Verified:
    """Evaluates the step's pending token and `draft` in one chunk and generates from it,
    as token-by-token steps would (engine thread). The session keeps the accepted tokens."""
    assert step.sample and len(step.tokens) == 1 and draft
    chunk = step.tokens + draft
    if len(chunk) > VERIFY_ROWS:
        raise ValueError(f"a verification chunk of {len(chunk)} tokens > {VERIFY_ROWS}")
    n0 = session.n_tokens
    rows = session.eval_all_logits(chunk)
    events: list[Event] = []
    params, allowed = step.params, step.allowed
    accepted = 0
    i = 0  # rows[i]: the logits after chunk[i]
    while True:
        token = sample(rows[i], params, decoding.rng, allowed)
        events += decoding.after(token)
        keep = i + 1  # chunk[:keep] stays in the session
        if decoding.done or decoding.pending != [token]:
            break  # nothing more to evaluate (an end-of-generation token is never kept)
        if keep == len(chunk) or chunk[keep] != token:
            break  # the model's own token is pending: the next step evaluates it
        decoding.evaluated()  # the drafted token was right and is evaluated already
        accepted += 1
        keep += 1
        nxt = None if decoding.done else decoding.sampling_next()
        if nxt is None:
            break
        params, allowed = nxt
        i += 1
    session.rewind(n0 + keep)
    return Verified(events, len(draft), accepted)
