"""Prompt-lookup drafts: guesses of a generation's next tokens taken from text it has seen.

Coding agents copy: a rewritten file repeats the file they were given, an edit's
`old_string` repeats lines of the context. When the last few generated tokens occurred
before (in the prompt or the output so far), the tokens that followed them then are a
good guess of what follows now. `PromptLookup` keeps, for every n-gram of the history
(n = MIN_NGRAM..MAX_NGRAM), where it last occurred with at least one token after it, and
proposes the continuation of the longest n-gram the history ends with.

`DraftLength` picks how many tokens to draft from the recent acceptance rate (and, given
the measured cost of a step, ds4d.serving.stepcost, the length that pays best at that
rate): a draft costs engine time even when it fails, so prose whose drafts keep failing
drafts nothing (with a short probe now and then, to notice when copying starts).

Both are pure: the engine loop verifies the drafts (ds4d.serving.speculation).
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from ds4d.serving.stepcost import StepCost

MIN_NGRAM = 2  # a single token repeats too often by chance to be worth a draft
MAX_NGRAM = 4


class PromptLookup:
    def __init__(self, history: Iterable[int] = (), *, min_ngram: int = MIN_NGRAM,
                 max_ngram: int = MAX_NGRAM) -> None:  # fmt: skip
        if not 1 <= min_ngram <= max_ngram:
            raise ValueError(f"n-gram sizes {min_ngram}..{max_ngram}")
        self.min_ngram = min_ngram
        self.max_ngram = max_ngram
        self._tokens: list[int] = []
        # n-gram -> the position just after its latest occurrence that has a successor
        self._after: dict[tuple[int, ...], int] = {}
        self.extend(history)

    def __len__(self) -> int:
        return len(self._tokens)

    def extend(self, tokens: Iterable[int]) -> None:
        """The history grew (the prompt, then each accepted token)."""
        toks = self._tokens
        for t in tokens:
            end = len(toks)  # the n-grams ending here now have a successor: t
            for n in range(self.min_ngram, min(self.max_ngram, end) + 1):
                self._after[tuple(toks[end - n : end])] = end
            toks.append(t)

    def propose(self, k: int) -> list[int]:
        """Up to k tokens that followed the longest n-gram the history ends with, at its
        latest earlier occurrence; [] when none occurred before."""
        toks = self._tokens
        if k <= 0:
            return []
        for n in range(min(self.max_ngram, len(toks)), self.min_ngram - 1, -1):
            start = self._after.get(tuple(toks[len(toks) - n :]))
            if start is not None:
                return toks[start : start + k]
        return []


class DraftLength:
    """How many tokens to draft next, from an average of recent drafts' acceptance.

    The rate is the fraction of the drafted tokens checked that were accepted (see
    `observe`), averaged with weight `decay` on the past. At a high rate the whole `max_draft` is drafted; below `min_rate` nothing
    is, except a probe of `probe` tokens once `probe_every` tokens were generated without
    a draft (a failed probe costs one verification of a short chunk)."""

    def __init__(self, max_draft: int, *, min_rate: float = 0.3, decay: float = 0.7,
                 probe: int = 2, probe_every: int = 32) -> None:  # fmt: skip
        if max_draft < 0:
            raise ValueError(f"max_draft {max_draft} < 0")
        self.max_draft = max_draft
        self.min_rate = min_rate
        self.decay = decay
        self.probe = min(probe, max_draft)
        self.probe_every = probe_every
        self.rate = 1.0  # optimistic: the first match is tried in full
        self._idle = 0  # tokens generated since the last draft

    def next(self, cost: StepCost | None = None, *, drafting: bool = False) -> int:
        """With `cost`, the length that pays best at the current rate
        (StepCost.best_length; `drafting`: a draft model's passes cost too), else one
        from the rate alone; below a paying length, only the probes (with `cost`, those
        whose cost fits its budget: StepCost.probe_pays)."""
        if self.max_draft == 0:
            return 0
        if cost is not None:
            k = cost.best_length(self.rate, self.max_draft, drafting=drafting)
            if k > 0:
                return k
        elif self.rate >= self.min_rate:
            # a run of accepted tokens is likely about rate / (1 - rate) long
            run = self.rate / max(1e-9, 1.0 - self.rate)
            return max(1, min(self.max_draft, round(run) + 1))
        if self._idle < self.probe_every or self.probe == 0:
            return 0
        if cost is not None and not cost.probe_pays(self.probe, self._idle, drafting=drafting):
            return 0
        return self.probe

    def observe(self, drafted: int, accepted: int) -> None:
        """A verification: `drafted` tokens proposed, the first `accepted` of them kept
        (drafted 0: a step that generated one token without a draft).

        The rate is per token checked: the accepted ones and the first rejected one. The
        tokens after a rejection were never tried, so counting them as failures (accepted
        over drafted) would make the rate of a long copy cut once look low, and its
        drafts short (7 drafted, 5 kept: 5/6, not 5/7)."""
        if drafted == 0:
            self._idle += 1
            return
        self._idle = 0
        checked = accepted + (1 if accepted < drafted else 0)
        self.rate = self.decay * self.rate + (1.0 - self.decay) * (accepted / checked)
