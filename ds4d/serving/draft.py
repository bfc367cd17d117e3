"""Draft-model speculation: a small model of the same vocabulary proposes the next tokens.

`DraftModel` holds the draft engine (loaded beside the target by the daemon, its
vocabulary checked by `check_same_vocabulary`) and one draft session per target slot
session. Before each proposal the draft session is made to hold the target session's
tokens plus the pending token: the longest common prefix is kept and the rest evaluated
(so a slot that switched to another conversation, reused another prefix or rewound a
rejected draft is followed exactly); then the draft model proposes k tokens, one
forward pass each. A draft session further behind than a step (a new prompt, tokens
generated without it) is brought up by the engine loop's prefill work (`catch_up`), not
inside a decode step. A greedy request's draft is the draft model's argmax at each
position (a point mass: the verification keeps it when the target's own token equals
it); a sampled request's draft is drawn from the draft's distribution q under the
request's own sampling parameters, and q goes with it to the acceptance rule
(ds4d.serving.speculation.RatioDraw). The first drafted position uses the constraint's
allowed ids, so a draft never starts with a token a tool call forbids.

Everything here runs on the engine loop's thread (ds4d.serving.loop calls `propose` from
its step), so the draft's forward passes are serialized with every other engine call.
"""

from __future__ import annotations

import time

import numpy as np

from ds4d.engine.engine import Engine, Session
from ds4d.engine.errors import ModelLoadError
from ds4d.engine.sampler import SamplingParams, distribution


def check_same_vocabulary(target: Engine, draft: Engine) -> None:
    """ModelLoadError unless the draft's token ids mean what the target's mean: the same
    logit width, the same token count, the same bytes and special flag for every id, and
    the same BOS, EOS and end-of-generation ids."""
    t, d = target.tokenizer, draft.tokenizer
    where = f"draft model {draft.path.name} cannot draft for {target.path.name}"
    if target.info.n_vocab != draft.info.n_vocab or t.n_vocab != d.n_vocab:
        raise ModelLoadError(
            f"{where}: vocabularies differ in size ({d.n_vocab} tokens, {draft.info.n_vocab} "
            f"logits against {t.n_vocab} tokens, {target.info.n_vocab} logits)"
        )
    for name in ("bos_id", "eos_id", "eog_ids"):
        if getattr(t, name) != getattr(d, name):
            raise ModelLoadError(
                f"{where}: {name} differs ({getattr(d, name)} against {getattr(t, name)})"
            )
    for i in range(t.n_vocab):
        if t.token_bytes(i) != d.token_bytes(i) or t.is_special(i) != d.is_special(i):
            raise ModelLoadError(
                f"{where}: token {i} differs ({d.token_bytes(i)!r} against {t.token_bytes(i)!r})"
            )


class Proposal:
    """k drafted tokens and, for a sampled request, the distribution each was drawn from
    (qs[i]: that of tokens[i]); qs is None for a greedy draft (point masses). Drafting
    `passes` tokens took `pass_s` seconds; before them the draft session caught up with
    `caught_up` tokens it had skipped in `catch_up_s` (0 and 0.0 when it only had the
    last step's, up to 2 tokens: those count in `pass_s`, as every step pays them)."""

    def __init__(self, tokens: list[int], qs: list[np.ndarray] | None, passes: int = 0,
                 pass_s: float = 0.0, caught_up: int = 0,
                 catch_up_s: float = 0.0) -> None:  # fmt: skip
        self.tokens = tokens
        self.qs = qs
        self.passes = passes
        self.pass_s = pass_s
        self.caught_up = caught_up
        self.catch_up_s = catch_up_s


class DraftModel:
    def __init__(self, engine: Engine, ctx: int) -> None:
        """`engine` is the draft's (its vocabulary checked against the target's); `ctx`
        the target slots' context, which each draft session gets too."""
        self.engine = engine
        self.ctx = ctx
        # id(target session) -> (the target session, its draft session)
        self._sessions: dict[int, tuple[Session, Session]] = {}

    @property
    def kv_bytes(self) -> int:
        return sum(s.kv_bytes for _, s in self._sessions.values())

    def session_for(self, target: Session) -> Session:
        """The draft session that follows `target` (made on first use: engine thread)."""
        pair = self._sessions.get(id(target))
        if pair is None or pair[0] is not target:
            pair = (target, self.engine.new_session(self.ctx))
            self._sessions[id(target)] = pair
        return pair[1]

    def behind(self, target: Session) -> int:
        """How many of the target's tokens its draft session lacks (engine thread)."""
        pair = self._sessions.get(id(target))
        if pair is None or pair[0] is not target:
            return target.n_tokens
        want = target.tokens
        return len(want) - _common(pair[1].tokens, want, len(want))

    def catch_up(self, target: Session, n: int) -> int:
        """Evaluates up to n of the target's tokens its draft session lacks, the common
        prefix kept (the loop's prefill work: a draft session that is behind does not
        draft); how many were evaluated."""
        session = self.session_for(target)
        want = target.tokens
        common = _common(session.tokens, want, len(want))
        session.rewind(common)
        todo = want[common : common + max(0, n)]
        if todo:
            session.eval(todo)
        return len(todo)

    def follow(self, target: Session, pending: int) -> tuple[Session, int]:
        """The draft session, holding the target's tokens and `pending`, with the logits
        after it, and how many tokens were evaluated: the common prefix is kept, the rest
        evaluated (at least the last token, whose logits are needed)."""
        session = self.session_for(target)
        want = target.tokens + [pending]
        common = _common(session.tokens, want, len(want) - 1)
        session.rewind(common)
        session.eval(want[common:])
        return session, len(want) - common

    def propose(self, target: Session, pending: int, k: int, params: SamplingParams,
                allowed: np.ndarray | None, rng: np.random.Generator) -> Proposal:  # fmt: skip
        """k tokens to follow `pending` in `target` (engine thread). Greedy parameters (or
        an infill rule, whose distribution is not rebuilt) draft the argmax; others draw
        from q, the draft's distribution under `params` (`allowed` at the first position)."""
        t0 = time.perf_counter()
        session, caught_up = self.follow(target, pending)
        t1 = time.perf_counter()
        sampled = not params.greedy and params.infill is None
        tokens: list[int] = []
        qs: list[np.ndarray] = []
        for i in range(k):
            if i:
                session.eval(tokens[-1:])
            logits = session.last_logits
            assert logits is not None  # an eval just left them
            mask = allowed if i == 0 else None
            if sampled:
                q = distribution(logits, params, mask)
                assert q is not None
                qs.append(q)
                tokens.append(_draw(q, rng))
            elif mask is not None:
                ids = np.flatnonzero(mask) if mask.dtype == np.bool_ else mask.reshape(-1)
                tokens.append(int(ids[int(np.argmax(logits[ids]))]))
            else:
                tokens.append(int(np.argmax(logits)))
        # The cost of drafting, per drafted token: every pass and what goes with it (the
        # sampling, and the catching up with the last step, as every step pays it); a
        # longer catch-up (tokens skipped by plain steps) is measured apart.
        end = time.perf_counter()
        if caught_up <= 2:
            return Proposal(tokens, qs if sampled else None, k, end - t0)
        return Proposal(tokens, qs if sampled else None, k - 1, end - t1, caught_up, t1 - t0)

    def close(self) -> None:
        for _, session in self._sessions.values():
            session.close()
        self._sessions.clear()
        self.engine.close()


def _common(have: list[int], want: list[int], most: int) -> int:
    """The length of the common prefix of `have` and `want`, at most `most`."""
    n = min(len(have), most)
    if have[:n] == want[:n]:
        return n
    common = 0
    while common < n and have[common] == want[common]:
        common += 1
    return common


def _draw(p: np.ndarray, rng: np.random.Generator) -> int:
    """A token drawn from the distribution p (float64, summing to 1 up to rounding)."""
    cum = np.cumsum(p)
    i = int(np.searchsorted(cum, rng.random() * cum[-1], side="right"))
    if i >= p.size or p[i] == 0:  # rounding at the end
        i = int(np.flatnonzero(p)[-1])
    return i
