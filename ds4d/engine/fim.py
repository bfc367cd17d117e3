"""A vocabulary's fill-in-the-middle tokens, found as llama.cpp finds them (llama-vocab.cpp).

A code model trained for infilling marks the text before the cursor, the text after it and
the place to write with three special tokens (prefix, suffix, middle); some also have a
padding token and repository-level markers (a repository name, a file separator) for
context from other files. The GGUF names them in its metadata
(`tokenizer.ggml.fim_pre_token_id`, ..., or the older `tokenizer.ggml.prefix_token_id`
family); converters often leave the keys out, so a token missing from the metadata is
looked up by its text in each family's spelling.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Protocol

# The texts of each role, as the families spell them. The first present in the vocabulary
# is taken. Roles llama.cpp does not look up by text for a family (StarCoder2's
# `<repo_name>` / `<file_sep>`) come after its spellings, so any vocabulary llama.cpp
# reads gets the same ids from both.
_TEXTS: dict[str, tuple[str, ...]] = {
    "pre": (
        "<|fim_prefix|>",  # Qwen2.5-Coder, CodeGemma
        "<fim-prefix>",
        "<fim_prefix>",  # StarCoder(2), Granite
        "<｜fim▁begin｜>",  # DeepSeek-Coder
        "<PRE>",
        "▁<PRE>",  # CodeLlama
        "<|code_prefix|>",  # GLM-4.5
        "<|prefix|>",  # Falcon-H1-Tiny-Coder
    ),
    "suf": (
        "<|fim_suffix|>",
        "<fim-suffix>",
        "<fim_suffix>",
        "<｜fim▁hole｜>",
        "<SUF>",
        "▁<SUF>",
        "<|code_suffix|>",
        "<|suffix|>",
    ),
    "mid": (
        "<|fim_middle|>",
        "<fim-middle>",
        "<fim_middle>",
        "<｜fim▁end｜>",
        "<MID>",
        "▁<MID>",
        "<|code_middle|>",
        "<|middle|>",
    ),
    "pad": ("<|fim_pad|>", "<fim-pad>", "<fim_pad>", "<PAD>", "[PAD]"),
    "rep": (
        "<|fim_repo|>",
        "<|repo_name|>",  # Qwen2.5-Coder
        "<fim-repo>",
        "<REPO>",
        "<reponame>",  # Granite
        "<repo_name>",  # StarCoder2 (not looked up by llama.cpp)
    ),
    "sep": (
        "<|file_sep|>",  # Qwen2.5-Coder
        "<file_sep>",  # StarCoder2 (not looked up by llama.cpp)
    ),
}

# Metadata keys of each role, in the order llama.cpp reads them: a later key present in
# the file wins (the deprecated prefix/suffix/middle keys come last).
_KEYS: dict[str, tuple[str, ...]] = {
    "pre": ("tokenizer.ggml.fim_pre_token_id", "tokenizer.ggml.prefix_token_id"),
    "suf": ("tokenizer.ggml.fim_suf_token_id", "tokenizer.ggml.suffix_token_id"),
    "mid": ("tokenizer.ggml.fim_mid_token_id", "tokenizer.ggml.middle_token_id"),
    "pad": ("tokenizer.ggml.fim_pad_token_id",),
    "rep": ("tokenizer.ggml.fim_rep_token_id",),
    "sep": ("tokenizer.ggml.fim_sep_token_id",),
}


class VocabLookup(Protocol):
    n_vocab: int

    def token_to_id(self, text: str) -> int | None: ...


@dataclass(frozen=True)
class FimTokens:
    """The ids of a vocabulary's FIM tokens; None where it has none."""

    pre: int | None = None
    suf: int | None = None
    mid: int | None = None
    pad: int | None = None
    rep: int | None = None  # repository name marker
    sep: int | None = None  # file separator

    @property
    def missing(self) -> list[str]:
        """The roles infilling needs that this vocabulary lacks."""
        roles = (("prefix", self.pre), ("suffix", self.suf), ("middle", self.mid))
        return [name for name, tid in roles if tid is None]

    @property
    def supported(self) -> bool:
        return not self.missing


def find_fim_tokens(metadata: Callable[[str], Any], vocab: VocabLookup) -> FimTokens:
    """The FIM tokens of a model: from its metadata (`metadata(key)` gives a value or None),
    else by their text in `vocab`. An id outside the vocabulary is ignored, as llama.cpp
    ignores it (with a warning) rather than trusting the file."""
    found: dict[str, int | None] = {}
    for role, keys in _KEYS.items():
        tid: int | None = None
        for key in keys:
            value = metadata(key)
            if isinstance(value, int) and not isinstance(value, bool):
                if 0 <= value < vocab.n_vocab:
                    tid = value
        if tid is None:
            tid = next(
                (i for text in _TEXTS[role] if (i := vocab.token_to_id(text)) is not None), None
            )
        found[role] = tid
    return FimTokens(**found)
