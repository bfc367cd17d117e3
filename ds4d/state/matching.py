"""Which state a request starts from: the matching order, as pure functions.

For a slot holding `live` tokens and a request whose rendered prompt is `prompt_text`
(tokenized in full as `prompt_tokens`):

1. memory-token: the live tokens are a prefix of the prompt's tokens.
2. memory-text:  the text that tokenizes to the live tokens (`decode`: special tokens as
   their text, no SentencePiece space prefix) is a byte prefix of the prompt text; keep
   the live tokens and tokenize only the rest of the text, as it reads after them (never
   slice the full tokenization — BPE may merge differently across the boundary).
3. partial memory-token (engines that rewind exactly): keep the common token prefix.
4. disk-text:    the KV file whose text is the longest byte prefix of the prompt, when it
   holds more tokens than step 3 keeps.
5. none:         cold prefill.

Whatever the live session loses is saved first (reason evict) when it is long enough.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

from ds4d.state.diskcache import DiskMatch
from ds4d.state.trace import CacheSource

Encode = Callable[[str], list[int]]  # rendered-text suffix -> tokens (specials parsed, no BOS)
# tokens -> the text that tokenizes to them; None when no text does (never a prefix)
Decode = Callable[[Sequence[int]], str | None]


@dataclass(frozen=True)
class Plan:
    source: CacheSource
    keep: int  # live tokens to keep (rewind to it when it is < len(live)); 0 = reset
    tokens: list[int] | None  # the prompt as the session must hold it; None for disk
    disk: DiskMatch | None = None
    evict_save: bool = False  # save the live session (reason evict) before changing it
    miss_reason: str = ""

    @property
    def promised(self) -> int:
        """Prompt tokens this plan expects to reuse."""
        return self.disk.tokens if self.disk is not None else self.keep


def common_prefix(a: Sequence[int], b: Sequence[int]) -> int:
    n = min(len(a), len(b))
    i = 0
    step = 256  # compare slices first: far faster than a Python loop over every token
    while i + step <= n and list(a[i : i + step]) == list(b[i : i + step]):
        i += step
    while i < n and a[i] == b[i]:
        i += 1
    return i


# kv-cache-min-tokens' default (ds4d.state.savepolicy.SavePolicy): a shorter shared prefix
# is not worth keeping over a fresh prefill, for agents' conversations
MIN_REUSE_TOKENS = 512


def plan_sync(
    live: Sequence[int],
    prompt_text: str,
    prompt_tokens: Sequence[int],
    *,
    decode: Decode,
    encode: Encode,
    lookup: Callable[[str], DiskMatch | None] | None = None,
    can_rewind: bool = True,
    min_tokens: int = MIN_REUSE_TOKENS,
) -> Plan:
    """Decide how a slot holding `live` reaches the prompt (see the module docstring).
    `min_tokens` (kv-cache-min-tokens): a shorter partial reuse is not taken, and a
    session losing fewer tokens is not saved."""
    n_live = len(live)
    if n_live:
        common = common_prefix(live, prompt_tokens)
        if common == n_live:
            return Plan("memory-token", n_live, list(prompt_tokens))
        live_text = decode(live)
        if live_text is not None and prompt_text.startswith(live_text):
            suffix = prompt_text[len(live_text) :]
            return Plan("memory-text", n_live, list(live) + (encode(suffix) if suffix else []))
        # The next token's logits must come from an evaluation, so at least one prompt
        # token is always left to prefill. A short shared head (the chat template's
        # opening tokens) is not worth keeping: it would make a complete miss look like a
        # hit and suppress the cold checkpoint.
        keep = min(common, len(prompt_tokens) - 1) if can_rewind else 0
        if keep < min_tokens:
            keep = 0
        reason = (
            "incoming-prompt-shorter-than-live"
            if len(prompt_tokens) < n_live and common == len(prompt_tokens)
            else "token-mismatch"
        )
    else:
        keep, reason = 0, "no-live-checkpoint"

    disk = lookup(prompt_text) if lookup is not None else None
    if disk is not None and disk.tokens > keep:
        return Plan("disk-text", 0, None, disk, n_live >= min_tokens, reason)
    if keep > 0:
        return Plan(
            "memory-token", keep, list(prompt_tokens), None, n_live - keep >= min_tokens, reason
        )
    return Plan("none", 0, list(prompt_tokens), None, n_live >= min_tokens, reason)


def disk_effective(
    loaded_tokens: Sequence[int], loaded_text: str, prompt_text: str, encode: Encode
) -> list[int]:
    """The prompt after a disk hit: the checkpoint's exact tokens, then the rest of the
    text tokenized on its own."""
    suffix = prompt_text[len(loaded_text) :]
    return list(loaded_tokens) + (encode(suffix) if suffix else [])
