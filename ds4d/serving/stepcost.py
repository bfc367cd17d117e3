"""What a speculating decode step costs, measured as the model serves, and the draft length
that pays best for it.

A verification chunk of n tokens costs t(n), a plain step t(1), a draft model's forward
pass t_d (none for prompt lookup). With a per-token acceptance rate a, a draft of k tokens
yields on average 1 + a + ... + a^k = (1 - a^(k+1)) / (1 - a) tokens (the accepted run
and the model's own next token) for t(k + 1) + k t_d, against 1 token for t(1) without a
draft. `best_length` picks the k of the highest tokens per second, 0 when no k beats a
plain step: on a CPU where a chunk of 8 costs nearly 8 steps (a 1.5B model on a loaded
2-core VM, docs/speculative.md), or a draft model nearly as slow as the target, even a
high acceptance rate does not pay, and then nothing is drafted.

The times are running averages of what the engine loop observes (its own clock): plain
steps of a lone decoding session, verification chunks by length, the draft model's
single-token passes. Until a length is measured its cost is a prior, `PRIOR_SLOPE` of a
step per extra token (the small-batch matvec's measured cost on the embedded model); until
a draft pass is measured it costs `DRAFT_PRIOR` of a step. A request that drafts from its
first step takes no plain step: t(1) is then inferred from the chunks measured, through
the prior, so a draft model as slow as the target stops drafting at once and the plain
steps that follow measure t(1) itself. A draft model's cost is what drafting took per
drafted token, every pass and its bookkeeping, in steps where the draft session only
caught up with the last step.

A probe (a short draft when no length pays, to notice a workload that turns copyable)
costs what its chunk costs beyond a plain step, its draft passes, and, with a draft model,
the draft session's catching up with every token it skipped: `catch_up` measures that per
token (one eval of the tokens skipped; measured on the Qwen2.5-Coder pair, 0.5B beside
1.5B: 0.09-0.17 of a target step a token, docs/speculative.md). A probe is made only when
its cost is at most `PROBE_SHARE` of the plain steps taken since the last draft
(`probe_pays`): a lookup probe of 2 (a chunk of 3 costing 1.6-2.7 steps) every 32 to 60
tokens; a draft model's, whose catching up alone costs more than that share of every
token skipped, not at all (a request that stopped drafting with its draft model drafts by
prompt lookup: ds4d.serving.speculation).
"""

from __future__ import annotations

PRIOR_SLOPE = 0.35  # t(n) / t(1) = 1 + PRIOR_SLOPE (n - 1) until measured
DRAFT_PRIOR = 0.25  # t_d / t(1) until measured
DECAY = 0.8  # weight of the past in each running average
CATCH_UP_PRIOR = 0.1  # a draft session's catch-up, target steps a token, until measured
PROBE_SHARE = 0.03  # the most of the plain steps' time that probes may cost (>= 0.97x)


class StepCost:
    def __init__(self, rows: int) -> None:
        """`rows`: the longest verification chunk (the pending token and the drafts)."""
        self.rows = rows
        self._chunk: list[float | None] = [None] * (rows + 1)  # seconds by chunk length
        self._draft: float | None = None  # seconds of one draft-model pass
        self._catch_up: float | None = None  # seconds a token of a draft session's catch-up

    def observe_chunk(self, n: int, seconds: float) -> None:
        """A plain step (n = 1) or a verification chunk of n tokens took `seconds`."""
        if 1 <= n <= self.rows and seconds > 0:
            self._chunk[n] = _average(self._chunk[n], seconds)

    def observe_draft(self, passes: int, seconds: float) -> None:
        """`passes` single-token passes of the draft model took `seconds` together."""
        if passes > 0 and seconds > 0:
            self._draft = _average(self._draft, seconds / passes)

    def observe_catch_up(self, tokens: int, seconds: float) -> None:
        """A draft session evaluated `tokens` it had skipped in `seconds` (one eval)."""
        if tokens > 0 and seconds > 0:
            self._catch_up = _average(self._catch_up, seconds / tokens)

    def catch_up_relative(self) -> float:
        """A draft session's catch-up per token skipped, in target steps."""
        one = self._step()
        if one is None or self._catch_up is None:
            return CATCH_UP_PRIOR
        return self._catch_up / one

    def probe_pays(self, k: int, idle: int, *, drafting: bool) -> bool:
        """Whether a probe of k drafted tokens after `idle` plain steps costs at most
        PROBE_SHARE of those steps: its chunk beyond a plain step, its draft passes and
        (`drafting`: a draft model) the draft session's catching up with the `idle`
        tokens it skipped."""
        cost = self.relative(k + 1) - 1.0
        if drafting:
            cost += k * self.draft_relative(True) + idle * self.catch_up_relative()
        return cost <= PROBE_SHARE * idle

    def relative(self, n: int) -> float:
        """t(n) / t(1): measured when both are, else the prior."""
        one, this = self._chunk[1], self._chunk[n]
        if n == 1:
            return 1.0
        if one is None or this is None:
            return _prior(n)
        return this / one

    def _step(self) -> float | None:
        """t(1): measured, else inferred through the prior from the chunks measured (a
        request that always drafts takes no plain step to measure), the smallest of those
        guesses (a stray slow chunk, the first after a prefill, makes a guess too large,
        and drafting look cheap), else None."""
        if self._chunk[1] is not None:
            return self._chunk[1]
        guesses = [t / _prior(n) for n, t in enumerate(self._chunk) if t is not None]
        return min(guesses) if guesses else None

    def draft_relative(self, drafting: bool) -> float:
        """t_d / t(1) (0 without a draft model)."""
        if not drafting:
            return 0.0
        one = self._step()
        if one is None or self._draft is None:
            return DRAFT_PRIOR
        return self._draft / one

    def best_length(self, rate: float, max_draft: int, *, drafting: bool) -> int:
        """The draft length of the most tokens per second at acceptance rate `rate`
        (0: a plain step is best). `drafting`: the drafts cost draft-model passes."""
        a = min(max(rate, 0.0), 0.999)
        d = self.draft_relative(drafting)
        best_k, best = 0, 1.0  # a plain step: one token for t(1)
        for k in range(1, min(max_draft, self.rows - 1) + 1):
            tokens = (1.0 - a ** (k + 1)) / (1.0 - a)
            speed = tokens / (self.relative(k + 1) + k * d)
            if speed > best:
                best_k, best = k, speed
        return best_k


def _prior(n: int) -> float:
    return 1.0 + PRIOR_SLOPE * (n - 1)


def _average(old: float | None, new: float) -> float:
    return new if old is None else DECAY * old + (1.0 - DECAY) * new
