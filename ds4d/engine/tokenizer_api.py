"""What every layer above the engine may ask of a model's tokenizer (`engine.tokenizer`):
the GGUF vocabulary's `ds4d.engine.tokenizer.Tokenizer` and DeepSeek V4's
`ds4d.engine.ds4_tokenizer.DS4Tokenizer` both implement it."""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Protocol

from ds4d.engine.tokenizer import IncrementalDecoder


class ModelTokenizer(Protocol):
    n_vocab: int
    bos_id: int | None
    eos_id: int | None
    eog_ids: frozenset[int]  # tokens that end a generation
    add_bos: bool  # a prompt starts with bos_id (the renderer may have written it)

    def encode(self, text: str, special: bool = True) -> list[int]:
        """Token ids of `text` (no BOS added); with `special`, control tokens written in
        the text are single tokens."""
        ...

    def encode_continuation(self, text: str, special: bool = True) -> list[int]:
        """`text` tokenized as it reads right after a non-special token (no SentencePiece
        space prefix before its first span)."""
        ...

    def canonical_text(self, text: str, special: bool = True) -> str:
        """`text` less what its tokenization drops (whitespace after some special tokens):
        what `source_text` gives back for its ids."""
        ...

    def source_text(self, ids: Sequence[int]) -> str | None:
        """The text whose tokenization (specials parsed) gives `ids`; None when no text
        does (their bytes end inside a character, a span lacks its space prefix)."""
        ...

    def decode(self, ids: Iterable[int], special: bool = True) -> str:
        """The text of `ids`, invalid UTF-8 replaced; without `special`, control tokens
        dropped."""
        ...

    def token_bytes(self, token_id: int) -> bytes:
        """The raw bytes a token stands for; ValueError outside the vocabulary."""
        ...

    def token_text(self, token_id: int) -> str:
        """The token's vocabulary entry as the GGUF stores it."""
        ...

    def token_to_id(self, text: str) -> int | None: ...

    def is_special(self, token_id: int) -> bool: ...

    def is_eog(self, token_id: int) -> bool: ...

    def incremental_decoder(self) -> IncrementalDecoder: ...
