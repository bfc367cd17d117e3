"""The GGUF's tokenizer, rebuilt with the `tokenizers` library to match llama.cpp.

Two GGUF tokenizer models are supported:

- ``gpt2``: byte-level BPE. Text is split by the pre-tokenizer regexes llama.cpp uses for
  the GGUF's ``tokenizer.ggml.pre`` (each regex splits every piece the previous one left,
  keeping matched and unmatched spans), then mapped to the GPT-2 byte alphabet and merged
  by the GGUF's merge ranks.
- ``llama``: SentencePiece BPE with byte fallback. Spaces become U+2581, a space is
  prefixed to every text span (``add_space_prefix``), and pieces merge by their score.

Special tokens are matched as whole tokens before any of that, as llama.cpp does: control
and unknown tokens only when ``special=True``, user-defined tokens always. Phi-3's special
tokens (recognized by ``general.name``) also drop the whitespace that follows them.
"""

from __future__ import annotations

import codecs
import logging
import os
import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

import numpy as np
from tokenizers import AddedToken, Regex, models, normalizers, pre_tokenizers
from tokenizers import Tokenizer as HFTokenizer

from ds4d.engine.errors import ModelLoadError
from ds4d.engine.gguf_file import GGUFFile
from ds4d.engine.gguf_reader import GGUFFormatError

log = logging.getLogger(__name__)

# tokenizer.ggml.token_type values (llama.cpp's llama_token_type).
UNDEFINED, NORMAL, UNKNOWN, CONTROL, USER_DEFINED, UNUSED, BYTE = range(7)

# ---------------------------------------------------------------------------------------
# Pre-tokenizer regexes per tokenizer.ggml.pre, after llama.cpp's src/llama-vocab.cpp.
# Where llama.cpp rewrote a Hugging Face regex only because std::regex lacks a feature
# (case-insensitive groups, \p{Lu}), the original regex is used: Oniguruma has them.

_GPT2 = r"'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)"
_CONTRACTIONS = r"(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])"
_LLAMA3 = (
    _CONTRACTIONS + r"|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*"
    r"|\s*[\r\n]+|\s+(?!\S)|\s+"
)
_QWEN2 = (
    _CONTRACTIONS + r"|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*"
    r"|\s*[\r\n]+|\s+(?!\S)|\s+"
)
_QWEN35 = (
    _CONTRACTIONS + r"|[^\r\n\p{L}\p{N}]?[\p{L}\p{M}]+|\p{N}| ?[^\s\p{L}\p{M}\p{N}]+[\r\n]*"
    r"|\s*[\r\n]+|\s+(?!\S)|\s+"
)
_DEEPSEEK_V3 = [
    r"\p{N}{1,3}",
    r"[一-龥぀-ゟ゠-ヿ]+",
    r"""[!"#$%&'()*+,\-./:;<=>?@\[\\\]^_`{|}~][A-Za-z]+|[^\r\n\p{L}\p{P}\p{S}]?[\p{L}\p{M}]+"""
    r"| ?[\p{P}\p{S}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+",
]
# Cased letters; the Greek Extended and letterlike code points that Unicode normalization
# would rewrite are spelled as escapes.
_DEEPSEEK_LLM = [
    r"[\r\n]",
    r"\s?[A-Za-zµÀ-ÖØ-öø-ƺƼ-ƿǄ-ʓʕ-ʯͰ-ͳͶͷͻ-ͽͿΆΈ-ΊΌΎ-ΡΣ-ϵϷ-ҁҊ-ԯԱ-ՖႠ-ჅᎠ-Ᏽᏸ-ᏽᲐ-ᲺᲽ-Ჿᴀ-ᴫᵫ-ᵷᵹ-ᶚḀ-ἕἘ-Ἕἠ-ὅὈ-Ὅὐ-ὗὙὛὝὟ-\x{1F7D}ᾀ-ᾴᾶ-ᾼ\x{1FBE}ῂ-ῄῆ-ῌῐ-\x{1FD3}ῖ-\x{1FDB}ῠ-Ῥῲ-ῴῶ-ῼℂℇℊ-ℓℕℙ-ℝℤ\x{2126}ℨ\x{212A}-ℭℯ-ℴℹℼ-ℿⅅ-ⅉⅎↃↄⰀ-ⱻⱾ-ⳤⳫ-ⳮⳲⳳꙀ-ꙭꚀ-ꚛꜢ-ꝯꝱ-ꞇꞋ-ꞎꭰ-ꮿﬀ-ﬆﬓ-ﬗＡ-Ｚａ-ｚ𐐀-𐑏𐒰-𐓓𐓘-𐓻𐲀-𐲲𐳀-𐳲𑢠-𑣟𞤀-𞥃]+",
    r"\s?[!-/:-~！-／：-～‘-‟　-。]+",
    r"\s+$",
    r"[一-龥ࠀ-一가-퟿]+",
    r"\p{N}+",
]
_DEEPSEEK_CODER = [r"[\r\n]", r"\s?\p{L}+", r"\s?\p{P}+", r"[一-龥ࠀ-一가-퟿]+", r"\p{N}"]
_FALCON = [r"[\p{P}\$\+<=>\^~\|`]+", _GPT2, r"[0-9][0-9][0-9]"]
_BLOOM = [r" ?[^(\s|.,!?…。，、।۔،)]+"]
# Mixed-case words with optional contractions (Mistral tekken, GPT-4o style).
_CASED_WORDS = (
    r"[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]*[\p{Ll}\p{Lm}\p{Lo}\p{M}]+{c}"
    r"|[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]+[\p{Ll}\p{Lm}\p{Lo}\p{M}]*{c}"
)
_TEKKEN = (
    _CASED_WORDS.replace("{c}", "") + r"|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n/]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)
_GPT4O = (
    _CASED_WORDS.replace("{c}", "(?i:'s|'t|'re|'ve|'m|'ll|'d)?")
    + r"|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n/]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)
# llama.cpp's LLAMA_VOCAB_PRE_TYPE_DEFAULT (an explicit "default" or a missing pre type).
_DEFAULT = [r"[\p{P}\$\+<=>\^~\|]+", _GPT2, r"\p{N}+", r"[0-9][0-9][0-9]"]


@dataclass(frozen=True)
class _PreType:
    regexes: Sequence[str]
    ignore_merges: bool = False  # a piece that is itself a token is not merged further
    add_bos: bool = False  # llama.cpp's default when the GGUF does not say


def _table(*rows: tuple[Iterable[str], _PreType]) -> dict[str, _PreType]:
    return {name: pre for names, pre in rows for name in names}


# fmt: off
_PRE_TYPES = _table(
    (["default"], _PreType(_DEFAULT)),
    (
        [
            "llama3", "llama-v3", "llama-bpe", "falcon3", "falcon-h1", "pixtral",
            "midm-2.0", "lfm2", "jina-v5-nano",
        ],
        _PreType([_LLAMA3], ignore_merges=True, add_bos=True),
    ),
    (["dbrx", "smaug-bpe", "glm4", "chatglm-bpe"], _PreType([_LLAMA3])),
    (["deepseek-llm"], _PreType(_DEEPSEEK_LLM)),
    (["deepseek-coder"], _PreType(_DEEPSEEK_CODER)),
    (["deepseek-v3", "hunyuan-dense", "joyai-llm", "hy_v4"], _PreType(_DEEPSEEK_V3)),
    (["falcon"], _PreType(_FALCON)),
    (
        [
            "starcoder", "refact", "command-r", "smollm", "codeshell", "exaone",
            "minerva-7b", "mellum2",
        ],
        _PreType([r"\p{N}", _GPT2]),
    ),
    (
        [
            "gpt-2", "phi-2", "jina-es", "jina-de", "gigachat", "jina-v2-es", "jina-v2-de",
            "a.x-4.0", "mellum", "modern-bert", "jina-v1-en", "jina-v2-code", "roberta-bpe",
            "mpt", "olmo", "jais", "trillion", "granite-docling", "exaone4",
        ],
        _PreType([_GPT2]),
    ),
    (
        [
            "qwen2", "deepseek-r1-qwen", "kormo", "f2llmv2", "megrez", "stablelm2",
            "hunyuan", "solar-open", "grok-2",
        ],
        _PreType([_QWEN2]),
    ),
    (["qwen35"], _PreType([_QWEN35])),
    (["poro-chat", "bloom", "gpt3-finnish"], _PreType(_BLOOM)),
    (["viking"], _PreType([*_BLOOM, r"\p{N}"])),
    (["tekken"], _PreType([_TEKKEN], ignore_merges=True, add_bos=True)),
    (["gpt-4o", "llama4", "kanana2", "talkie", "minimax-m2"], _PreType([_GPT4O])),
    (
        ["seed-coder"],
        _PreType(
            [
                _CONTRACTIONS + r"|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1}| ?[^\s\p{L}\p{N}\r\n]+"
                r"|\s*[\r\n]+|\s+(?!\S)|\s+"
            ]
        ),
    ),
    (
        ["bailingmoe", "bailingmoe2", "llada-moe"],
        _PreType(
            [
                r"'(?:[sSdDmMtT]|[lL][lL]|[vV][eE]|[rR][eE])|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}"
                r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]|\s+(?!\S)|\s+"
            ]
        ),
    ),
    (
        ["minicpm5"],
        _PreType([r"\p{N}{1,3}", _QWEN2.replace(r"|\p{N}|", r"|\p{N}+|")], ignore_merges=True),
    ),
)

# Token texts llama.cpp treats as "end of generation" (llama-vocab.cpp, special_eog_ids).
_EOG_TEXTS = frozenset(
    {
        "<|eot_id|>", "<|im_end|>", "<|end|>", "<|return|>", "<|call|>", "<|flush|>",
        "<|calls|>", "<end_of_turn>", "<|endoftext|>", "</s>", "<|eom_id|>", "<EOT>",
        "_<EOT>", "[EOT]", "[EOS]", "<|end_of_text|>", "<end_of_utterance>", "<eos>",
        "<turn|>", "<|tool_response>", "<｜end▁of▁sentence｜>", "[e~[",
    }
)
# fmt: on
# FIM pad/repo/file-separator tokens also end generation in llama.cpp.
_FIM_EOG_TEXTS = (
    ("<|fim_pad|>", "<fim-pad>", "<fim_pad>", "<PAD>", "[PAD]"),
    ("<|fim_repo|>", "<|repo_name|>", "<fim-repo>", "<REPO>", "<reponame>"),
    ("<|file_sep|>",),
)

_SPM_SPACE = "\u2581"
# What C's isspace() accepts: the whitespace llama.cpp strips beside an rstrip token.
_C_WHITESPACE = " \t\n\v\f\r"


def _strips_after_special(model_name: str) -> bool:
    """Phi-3's special tokens drop the whitespace after them (its tokenizer.json marks
    them rstrip); llama.cpp recognizes Phi-3 by the lowercased general.name."""
    name = model_name.lower()
    return "phi-3" in name or "phi3" in name


def _rstrip_ids(types: np.ndarray, ids: dict[str, int]) -> frozenset[int]:
    """The Phi-3 tokens that drop the whitespace after them: every special token and
    ``</s>``, except ``<unk>``, ``<s>`` and ``<|endoftext|>``, as llama.cpp sets them."""
    found = set(np.flatnonzero(np.isin(types, (CONTROL, USER_DEFINED, UNKNOWN))).tolist())
    if "</s>" in ids:
        found.add(ids["</s>"])
    found.difference_update(ids[t] for t in ("<unk>", "<s>", "<|endoftext|>") if t in ids)
    return frozenset(found)


def _gpt2_byte_alphabet() -> dict[str, int]:
    """GPT-2's reversible map from bytes to printable characters, inverted."""
    printable = [*range(ord("!"), ord("~") + 1), *range(0xA1, 0xAD), *range(0xAE, 0x100)]
    chars = {b: b for b in printable}
    extra = 0
    for b in range(256):
        if b not in chars:
            chars[b] = 256 + extra
            extra += 1
    return {chr(c): b for b, c in chars.items()}


_BYTE_OF_CHAR = _gpt2_byte_alphabet()
# str.translate table: byte-alphabet character -> the latin-1 character of its byte.
_BYTE_TRANSLATE = {ord(ch): b for ch, b in _BYTE_OF_CHAR.items()}


# Lines of exactly one space between two non-empty parts, one per line: the usual merges.
_SIMPLE_MERGES = re.compile(r"(?:[^ \n]+ [^ \n]+\n)*[^ \n]+ [^ \n]+")


def _merge_pairs(merges: Sequence[tuple[str, str]] | Sequence[str]) -> list[tuple[str, str]]:
    """GGUF merges ("left right", split at the first space after the first character)
    as pairs; one joined split when every line is simply "left right"."""
    if not merges or not isinstance(merges[0], str):
        return [tuple(m) for m in merges]  # type: ignore[misc]
    lines: Sequence[str] = merges  # type: ignore[assignment]
    joined = "\n".join(lines)
    if _SIMPLE_MERGES.fullmatch(joined):
        parts = joined.replace("\n", " ").split(" ")
        return list(zip(parts[::2], parts[1::2], strict=True))
    pairs = []
    for line in lines:
        cut = line.find(" ", 1)
        if cut > 0:
            pairs.append((line[:cut], line[cut + 1 :]))
    return pairs


_HASH_BASE = 0x100000001B3  # odd, so invertible modulo 2^64


def _spm_splits(
    tokens: list[str], types: np.ndarray, ids: dict[str, int]
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(left id, right id, token id) of every way to cut a token in two known tokens;
    byte tokens are never merge results.

    A 262k vocabulary has over a million cuts, too many to look up one by one. All cuts
    are looked up at once by a polynomial hash (mod 2^64) of the left and right parts,
    computed from prefix sums over the vocabulary's code points. Every hit is checked on
    the strings themselves, so a collision cannot add a merge; equal strings have equal
    hashes, so none is missed unless two vocabulary entries collide, which is checked
    (the one-by-one lookup then runs instead)."""
    n = len(tokens)
    empty = np.zeros(0, np.int64)
    if n == 0:
        return empty, empty, empty
    lengths = np.fromiter(map(len, tokens), np.int64, n)
    starts = np.cumsum(lengths) - lengths
    codes = np.frombuffer("".join(tokens).encode("utf-32-le", "surrogatepass"), np.uint32)
    total = len(codes)
    with np.errstate(over="ignore"):
        base = np.full(total, _HASH_BASE, np.uint64)
        power = np.concatenate(([np.uint64(1)], np.cumprod(base)))
        inverse = np.full(total, pow(_HASH_BASE, -1, 1 << 64), np.uint64)
        inverse_power = np.cumprod(inverse)  # B^-(i+1) for code point i
        prefix = np.concatenate(([np.uint64(0)], np.cumsum(codes * inverse_power)))

        def span_hash(a: np.ndarray, b: np.ndarray) -> np.ndarray:
            hashes: np.ndarray = (prefix[b] - prefix[a]) * power[b]
            return hashes

        token_hash = span_hash(starts, starts + lengths)
        # hash -> the lowest id with that hash (the id a duplicated text keeps)
        order = np.lexsort((np.arange(n), token_hash))
        sorted_hash = token_hash[order]
        first = np.concatenate(([True], sorted_hash[1:] != sorted_hash[:-1]))
        for i in np.flatnonzero(~first).tolist():  # same hash: must be the same text
            if tokens[order[i]] != tokens[order[i - 1]]:
                return _spm_splits_one_by_one(tokens, types, ids)
        known_hash, known_id = sorted_hash[first], order[first]

        cand = np.flatnonzero((types != BYTE) & (lengths > 1))
        per = lengths[cand] - 1
        token = np.repeat(cand, per)
        group_start = np.repeat(np.cumsum(per) - per, per)
        cut = np.arange(len(token)) - group_start + 1
        a = starts[token]
        m = a + cut
        b = a + lengths[token]

        def lookup(h: np.ndarray) -> np.ndarray:
            at = np.minimum(np.searchsorted(known_hash, h), len(known_hash) - 1)
            return np.where(known_hash[at] == h, known_id[at], -1)

        left, right = lookup(span_hash(a, m)), lookup(span_hash(m, b))
    hit = np.flatnonzero((left >= 0) & (right >= 0))
    left, right, token = left[hit], right[hit], token[hit]
    texts = np.array(tokens, dtype=object)
    exact = (texts[left] + texts[right] == texts[token]).astype(bool)
    return left[exact], right[exact], token[exact]


def _spm_splits_one_by_one(
    tokens: list[str], types: np.ndarray, ids: dict[str, int]
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    found = [
        (ids[w[:cut]], ids[w[cut:]], i)
        for i in np.flatnonzero(types != BYTE).tolist()
        for w in (tokens[i],)
        for cut in range(1, len(w))
        if w[:cut] in ids and w[cut:] in ids
    ]
    arr = np.array(found, np.int64).reshape(-1, 3)
    return arr[:, 0], arr[:, 1], arr[:, 2]


class _Metadata:
    """The tokenizer's view of a GGUF's metadata: a GGUFFile (fast: arrays come undecoded)
    or a gguf.GGUFReader (kept for callers that already hold one)."""

    def __init__(self, source: GGUFFile | Any) -> None:
        self._file = source if isinstance(source, GGUFFile) else None
        self._reader: Any = None if self._file is not None else source

    def get(self, key: str, default: Any = None) -> Any:
        if self._file is not None:
            return self._file.get(key, default)
        field = self._reader.fields.get(key)
        if field is None:
            return default
        try:
            return field.contents()
        except Exception as exc:  # a malformed field in a user's file
            raise ModelLoadError(f"GGUF metadata {key} is unreadable: {exc}") from None

    def strings(self, key: str) -> list[str] | None:
        if self._file is not None:
            arr = self._file.get_array(key)
            if arr is None:
                plain: list[str] | None = self._file.get(key)
                return plain
            try:
                return arr.strings()
            except (GGUFFormatError, TypeError) as exc:
                raise ModelLoadError(f"GGUF metadata {key} is unreadable: {exc}") from None
        values: list[str] | None = self.get(key)
        return values

    def numbers(self, key: str, dtype: type) -> np.ndarray | None:
        if self._file is not None:
            arr = self._file.get_array(key)
            if arr is None:
                value = self._file.get(key)
                return None if value is None else np.asarray(value, dtype)
            try:
                return arr.numpy().astype(dtype)
            except TypeError as exc:
                raise ModelLoadError(f"GGUF metadata {key} is unreadable: {exc}") from None
        value = self.get(key)
        return None if value is None else np.asarray(value, dtype)


class Tokenizer:
    """Text <-> token ids for one GGUF vocabulary (see the module docstring)."""

    def __init__(
        self,
        *,
        model: str,
        pre: str | None,
        tokens: list[str],
        token_types: Sequence[int] | np.ndarray,
        merges: Sequence[tuple[str, str]] | Sequence[str],
        scores: Sequence[float] | np.ndarray | None = None,
        bos_id: int | None = None,
        eos_id: int | None = None,
        eot_id: int | None = None,
        unk_id: int | None = None,
        add_bos: bool | None = None,
        add_space_prefix: bool | None = None,
        strip_after_special: bool = False,
        lowercase: bool = False,
        strip_accents: bool | None = None,
    ) -> None:
        self.model = model
        self.pre = pre
        self.n_vocab = len(tokens)
        # llama.cpp names empty entries so that every token has a distinct text.
        if not all(tokens):
            tokens = [text or f"[EMPTY_{i}]" for i, text in enumerate(tokens)]
        self._tokens = tokens
        types = np.array(token_types, dtype=np.int32)
        if len(types) != self.n_vocab:
            raise ModelLoadError(
                f"tokenizer has {len(types)} token types for {self.n_vocab} tokens"
            )
        # The first of duplicate texts keeps its id (dict() keeps the last, so reverse).
        n = self.n_vocab
        self._ids: dict[str, int] = dict(zip(reversed(tokens), range(n - 1, -1, -1), strict=True))

        if model == "gpt2":
            backend, default_bos = self._byte_level_bpe(_merge_pairs(merges), pre)
            self.add_space_prefix = False
        elif model == "llama":
            if scores is None:
                raise ModelLoadError("SentencePiece GGUF has no tokenizer.ggml.scores")
            if len(scores) != n:
                raise ModelLoadError(f"tokenizer has {len(scores)} scores for {n} tokens")
            self.add_space_prefix = True if add_space_prefix is None else add_space_prefix
            backend = self._sentencepiece_bpe(
                tokens, types, np.asarray(scores, np.float64), unk_id, self.add_space_prefix
            )
            default_bos = True
        elif model == "bert":
            backend = self._wordpiece(tokens, types, unk_id, lowercase,
                                      lowercase if strip_accents is None else strip_accents)  # fmt: skip
            self.add_space_prefix = False
            default_bos = True  # [CLS]
        else:  # pragma: no cover - from_gguf refuses other models first
            raise ModelLoadError(f"unsupported tokenizer model {model!r}")

        self.bos_id = bos_id
        self.eos_id = eos_id
        self.add_bos = default_bos if add_bos is None else add_bos
        self.eog_ids = self._end_of_generation_ids(eos_id, eot_id)
        # llama.cpp promotes end-of-generation tokens to control, user-defined ones too
        # (it adds the control attribute): plain text (special=False) never becomes one,
        # as Phi-3's user-defined "</s>" written in a file must not.
        for i in self.eog_ids:
            if types[i] not in (CONTROL, UNKNOWN):
                types[i] = CONTROL
        self._type_array = types
        self._types: list[int] = types.tolist()

        def added(kinds: tuple[int, ...], special: bool) -> list[AddedToken]:
            return [
                AddedToken(tokens[i], special=special, normalized=False)
                for i in np.flatnonzero(np.isin(types, kinds)).tolist()
            ]

        control = added((CONTROL, UNKNOWN), special=True)
        user = added((USER_DEFINED,), special=False)
        backend.add_special_tokens(control)
        backend.add_tokens(user)
        self._backend = backend
        # The same tokenizer that leaves control tokens as plain text (special=False): a
        # second instance, so that encode has no shared mutable state across threads. It
        # shares the model (vocabulary and merges) with the first, so it costs nothing.
        plain = HFTokenizer(backend.model)
        plain.normalizer = backend.normalizer
        plain.pre_tokenizer = backend.pre_tokenizer
        plain.add_special_tokens(control)
        plain.add_tokens(user)
        plain.encode_special_tokens = True
        self._backend_plain = plain
        # SentencePiece without the space prefix, for text that continues a span.
        self._backend_cont: HFTokenizer | None = None
        if self.add_space_prefix:
            cont = HFTokenizer(backend.model)
            cont.normalizer = normalizers.Replace(" ", _SPM_SPACE)
            self._backend_cont = cont

        self._bytes = self._token_bytes_table()
        self._rstrip_ids = _rstrip_ids(types, self._ids) if strip_after_special else None
        self._last_canonical: tuple[str, bool, str] | None = None

    # -- construction -------------------------------------------------------------------

    @classmethod
    def from_gguf(cls, source: GGUFFile | str | os.PathLike[str] | Any) -> Tokenizer:
        """The tokenizer of a GGUFFile (or a path to one, or a gguf.GGUFReader)."""
        if isinstance(source, (str, os.PathLike)):
            source = GGUFFile(source)
        meta = _Metadata(source)
        model = meta.get("tokenizer.ggml.model")
        if model not in ("gpt2", "llama", "bert"):
            raise ModelLoadError(
                f"unsupported tokenizer model {model!r} (tokenizer.ggml.model); expected "
                "'gpt2' (byte-level BPE), 'llama' (SentencePiece) or 'bert' (WordPiece)"
            )
        tokens = meta.strings("tokenizer.ggml.tokens")
        if not tokens or not isinstance(tokens, list):
            raise ModelLoadError("GGUF has no tokenizer vocabulary (tokenizer.ggml.tokens)")
        n = len(tokens)
        types = meta.numbers("tokenizer.ggml.token_type", np.int32)
        if types is None:
            types = np.full(n, NORMAL, np.int32)
        scores = meta.numbers("tokenizer.ggml.scores", np.float64)
        if len(types) != n or (scores is not None and len(scores) != n):
            raise ModelLoadError(
                "GGUF tokenizer.ggml.token_type / .scores do not have one entry per token"
            )
        merges = meta.strings("tokenizer.ggml.merges") or []
        if model == "gpt2" and not merges:
            raise ModelLoadError("byte-level BPE GGUF has no tokenizer.ggml.merges")

        def token_id(key: str) -> int | None:
            value = meta.get(f"tokenizer.ggml.{key}")
            if value is None:
                return None
            if not isinstance(value, int) or not 0 <= value < n:
                raise ModelLoadError(
                    f"GGUF tokenizer.ggml.{key} is {value!r}, expected a token id below {n}"
                )
            return value

        def flag(key: str) -> bool | None:
            value = meta.get(f"tokenizer.ggml.{key}")
            return None if value is None else bool(value)

        pre = meta.get("tokenizer.ggml.pre")
        name = meta.get("general.name")
        return cls(
            model=model,
            pre=pre if isinstance(pre, str) else None,
            tokens=tokens,
            token_types=types,
            merges=merges,
            scores=scores,
            # A WordPiece file may name its [CLS] only as cls_token_id (llama.cpp's BOS).
            bos_id=token_id("bos_token_id")
            if model != "bert" or meta.get("tokenizer.ggml.bos_token_id") is not None
            else token_id("cls_token_id"),  # fmt: skip
            eos_id=token_id("eos_token_id"),
            eot_id=token_id("eot_token_id"),
            unk_id=token_id("unknown_token_id"),
            add_bos=flag("add_bos_token"),
            add_space_prefix=flag("add_space_prefix"),
            strip_after_special=isinstance(name, str) and _strips_after_special(name),
            lowercase=bool(flag("normalizer.lowercase")),
            strip_accents=flag("normalizer.strip_accents"),
        )

    def _byte_level_bpe(
        self, merges: list[tuple[str, str]], pre: str | None
    ) -> tuple[HFTokenizer, bool]:
        pre_type = _PRE_TYPES.get(pre or "default")
        if pre_type is None:
            log.warning(
                "unknown pre-tokenizer type %r (tokenizer.ggml.pre); using GPT-2's split "
                "regex, tokenization may differ from the model's training",
                pre,
            )
            pre_type = _PreType([_GPT2])
        vocab = self._ids
        try:
            bpe = models.BPE(vocab=vocab, merges=merges, ignore_merges=pre_type.ignore_merges)
        except Exception:  # noqa: BLE001 - tokenizers raises a bare Exception
            # tokenizers refuses merges whose parts or result are not tokens; such merges
            # could never fire in llama.cpp's BPE either, so they are dropped.
            usable = [(a, b) for a, b in merges if a in vocab and b in vocab and a + b in vocab]
            bpe = models.BPE(vocab=vocab, merges=usable, ignore_merges=pre_type.ignore_merges)
        backend = HFTokenizer(bpe)
        backend.pre_tokenizer = pre_tokenizers.Sequence(
            [
                *(pre_tokenizers.Split(Regex(r), behavior="isolated") for r in pre_type.regexes),
                pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
            ]
        )
        return backend, pre_type.add_bos

    def _wordpiece(
        self,
        tokens: list[str],
        types: np.ndarray,
        unk_id: int | None,
        lowercase: bool,
        strip_accents: bool,
    ) -> HFTokenizer:
        """llama.cpp's WPM tokenizer (BERT-style encoders) as tokenizers' WordPiece. The
        GGUF writes a word's first piece with a phantom space (▁) and a continuation bare;
        WordPiece wants them bare and `##`-prefixed. Text is cleaned of control characters,
        lowercased and stripped of accents as the file says, split at whitespace, at
        punctuation and ASCII symbols and around CJK characters (BertNormalizer and
        BertPreTokenizer do exactly that); each word is matched longest piece first, and a
        word with a part no piece matches is one unknown token. Unlike transformers, a long
        word is matched too (llama.cpp sets no 100-character limit)."""
        if unk_id is None:
            raise ModelLoadError("WordPiece GGUF has no tokenizer.ggml.unknown_token_id")
        vocab: dict[str, int] = {}
        for i, (text, kind) in enumerate(zip(tokens, types.tolist(), strict=True)):
            if kind in (CONTROL, UNKNOWN, USER_DEFINED):
                piece = text
            elif text.startswith(_SPM_SPACE):
                piece = text[len(_SPM_SPACE) :]
            else:
                piece = "##" + text
            vocab.setdefault(piece, i)
        wp = models.WordPiece(vocab=vocab, unk_token=tokens[unk_id],
                              max_input_chars_per_word=1 << 30)  # fmt: skip
        backend = HFTokenizer(wp)
        backend.normalizer = normalizers.BertNormalizer(
            clean_text=True, handle_chinese_chars=True, strip_accents=strip_accents,
            lowercase=lowercase,
        )  # fmt: skip
        backend.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
        return backend

    def _sentencepiece_bpe(
        self,
        tokens: list[str],
        types: np.ndarray,
        scores: np.ndarray,
        unk_id: int | None,
        space_prefix: bool,
    ) -> HFTokenizer:
        # llama.cpp merges the adjacent pair whose concatenation is the best-scoring token;
        # as BPE merges, that is every split of every token, ranked by the token's score
        # (ties: the lower token id, then the lower left id).
        left, right, token = _spm_splits(tokens, types, self._ids)
        order = np.lexsort((left, token, -scores[token]))
        texts = np.array(tokens, dtype=object)
        merges = list(zip(texts[left[order]].tolist(), texts[right[order]].tolist(), strict=True))
        unk = tokens[unk_id] if unk_id is not None else None
        bpe = models.BPE(
            vocab=self._ids,
            merges=merges,
            unk_token=unk,
            byte_fallback=True,
            fuse_unk=False,
        )
        backend = HFTokenizer(bpe)
        # Applied to each span between special tokens, as llama.cpp prefixes every span.
        steps = [normalizers.Prepend(_SPM_SPACE)] if space_prefix else []
        backend.normalizer = normalizers.Sequence([*steps, normalizers.Replace(" ", _SPM_SPACE)])
        return backend

    def _end_of_generation_ids(self, eos_id: int | None, eot_id: int | None) -> frozenset[int]:
        eog = {i for text in _EOG_TEXTS if (i := self._ids.get(text)) is not None}
        for group in _FIM_EOG_TEXTS:
            found = next((self._ids[t] for t in group if t in self._ids), None)
            if found is not None:
                eog.add(found)
        eog.update(i for i in (eos_id, eot_id) if i is not None)
        # gpt-oss style vocabularies: <|end|> closes a message there, not the generation.
        has = {self._tokens[i] for i in eog}
        if "<|end|>" in has and "<|call|>" in has and ("<|return|>" in has or "<|flush|>" in has):
            eog.discard(self._ids["<|end|>"])
        return frozenset(eog)

    def _token_bytes_table(self) -> list[bytes]:
        """The bytes of every token: the normal tokens converted in one pass over the
        joined vocabulary, the few others one by one."""
        normal = self._type_array == NORMAL
        texts = [t if keep else "" for t, keep in zip(self._tokens, normal.tolist(), strict=True)]
        table: list[bytes] | None = None
        if self.model in ("llama", "bert"):
            joined = "\0".join(texts).replace(_SPM_SPACE, " ").encode()
            table = joined.split(b"\0")
        else:
            try:  # each character of the byte alphabet is one byte
                joined = "".join(texts).translate(_BYTE_TRANSLATE).encode("latin-1")
            except UnicodeEncodeError:
                pass
            else:
                ends = np.cumsum(np.fromiter(map(len, texts), np.int64, len(texts))).tolist()
                table = [joined[a:b] for a, b in zip([0, *ends[:-1]], ends, strict=True)]
        if table is None or len(table) != self.n_vocab:
            return [self._token_bytes(i) for i in range(self.n_vocab)]
        for i in np.flatnonzero(~normal).tolist():
            table[i] = self._token_bytes(i)
        return table

    def _token_bytes(self, i: int) -> bytes:
        text, kind = self._tokens[i], self._types[i]
        if kind in (CONTROL, USER_DEFINED, UNKNOWN):
            return text.encode()
        if kind == BYTE and len(text) == 6 and text.startswith("<0x") and text.endswith(">"):
            try:
                return bytes([int(text[3:5], 16)])
            except ValueError:
                return b""
        if kind != NORMAL:  # unused/undefined tokens print nothing, as in llama.cpp
            return b""
        if self.model == "llama":
            return text.replace(_SPM_SPACE, " ").encode()
        try:
            return text.translate(_BYTE_TRANSLATE).encode("latin-1")
        except UnicodeEncodeError:  # a character outside the byte alphabet: keep it
            return text.encode()

    # -- the interface ------------------------------------------------------------------

    def encode(self, text: str, special: bool = True) -> list[int]:
        """Token ids of ``text`` (no BOS added). With ``special`` control tokens written
        in the text are single tokens; without, they are tokenized as the plain text."""
        if not text:
            return []
        backend = self._backend if special else self._backend_plain
        enc = backend.encode(text, add_special_tokens=False)
        if self._rstrip_ids is None or self._rstrip_ids.isdisjoint(enc.ids):
            return enc.ids
        return self._strip_after_special(text, enc.ids, enc.offsets, backend)[0]

    def canonical_text(self, text: str, special: bool = True) -> str:
        """``text`` less the whitespace its tokenization drops after a special token
        (Phi-3's rstrip tokens); it tokenizes to the same ids as ``text`` and is what
        ``source_text`` gives back for them. Other vocabularies return ``text``."""
        if self._rstrip_ids is None or not text:
            return text
        last = self._last_canonical  # prompts are canonicalized several times per request
        if last is not None and last[0] == text and last[1] == special:
            return last[2]
        backend = self._backend if special else self._backend_plain
        enc = backend.encode(text, add_special_tokens=False)
        canonical = text
        if not self._rstrip_ids.isdisjoint(enc.ids):
            canonical = self._strip_after_special(text, enc.ids, enc.offsets, backend)[1]
        self._last_canonical = (text, special, canonical)
        return canonical

    def _strip_after_special(
        self,
        text: str,
        ids: list[int],
        offsets: list[tuple[int, int]],
        backend: HFTokenizer,
    ) -> tuple[list[int], str]:
        """(ids, text) with the C-locale whitespace that opens each span following an
        rstrip token removed, the shortened spans tokenized again (each span between
        special tokens is tokenized on its own, so the other spans keep their ids)."""
        assert self._rstrip_ids is not None
        out_ids: list[int] = []
        out_text: list[str] = []
        span_start = 0  # where the text after the last matched special token starts
        strip = False  # that token drops the whitespace after it
        span: list[int] = []

        def close_span(end: int) -> None:
            piece = text[span_start:end]
            kept = piece.lstrip(_C_WHITESPACE) if strip else piece
            if len(kept) == len(piece):
                out_ids.extend(span)
            elif kept:
                out_ids.extend(backend.encode(kept, add_special_tokens=False).ids)
            out_text.append(kept)

        for token, (start, end) in zip(ids, offsets, strict=True):
            if self.is_special(token) and text[start:end] == self._tokens[token]:
                close_span(start)
                out_ids.append(token)
                out_text.append(text[start:end])
                span_start, strip, span = end, token in self._rstrip_ids, []
            else:
                span.append(token)
        close_span(len(text))
        return out_ids, "".join(out_text)

    def encode_continuation(self, text: str, special: bool = True) -> list[int]:
        """Token ids of ``text`` written right after a non-special token: it continues
        that token's span, so SentencePiece's space prefix (``add_space_prefix``) goes
        only before the spans that follow a special token inside ``text``."""
        if not text or self._backend_cont is None:
            return self.encode(text, special)
        backend = self._backend if special else self._backend_plain
        enc = backend.encode(text, add_special_tokens=False)
        cut = len(text)
        for token, (start, end) in zip(enc.ids, enc.offsets, strict=True):
            # a special token matched in the text (not an unknown piece of a span)
            if self.is_special(token) and text[start:end] == self._tokens[token]:
                cut = start
                break
        head = self._backend_cont.encode(text[:cut], add_special_tokens=False).ids if cut else []
        return head + self.encode(text[cut:], special)

    def source_text(self, ids: Sequence[int]) -> str | None:
        """The text whose tokenization (special tokens parsed, as ``encode``) gives
        ``ids``: ``decode`` less the space SentencePiece's ``add_space_prefix`` inserts
        where a span starts (the start, after each special token). None when ``ids``
        cannot come from such text (a span not opening with that space) or end inside a
        UTF-8 character."""
        table = self._bytes
        if not self.add_space_prefix:
            parts = [table[i] for i in ids]
        else:
            parts = []
            span_start = True
            for i in ids:
                piece = table[i]
                if self.is_special(i):
                    span_start = True
                elif span_start:
                    if not piece.startswith(b" "):
                        return None
                    piece = piece[1:]
                    span_start = False
                parts.append(piece)
        try:
            return b"".join(parts).decode()
        except UnicodeDecodeError:
            return None

    def decode(self, ids: Iterable[int], special: bool = True) -> str:
        """Text of ``ids``; invalid UTF-8 becomes U+FFFD. ``special=False`` drops control
        tokens (llama.cpp's token_to_piece without special)."""
        table = self._bytes
        ids = list(ids)
        if ids and not 0 <= min(ids) <= max(ids) < self.n_vocab:
            raise ValueError(f"token id out of range [0, {self.n_vocab}): {min(ids)}..{max(ids)}")
        if special:
            data = b"".join([table[i] for i in ids])
        else:
            data = b"".join([table[i] for i in ids if not self._is_control(i)])
        return data.decode("utf-8", errors="replace")

    def token_bytes(self, token_id: int) -> bytes:
        """The raw bytes a token stands for (special tokens: their text)."""
        if not 0 <= token_id < self.n_vocab:
            raise ValueError(f"token id {token_id} out of range [0, {self.n_vocab})")
        return self._bytes[token_id]

    def token_text(self, token_id: int) -> str:
        """The token's entry in the GGUF vocabulary (e.g. 'Ġthe' for byte-level BPE)."""
        return self._tokens[token_id]

    def token_to_id(self, text: str) -> int | None:
        """The id of the vocabulary entry ``text`` (as stored in the GGUF), or None."""
        return self._ids.get(text)

    def is_special(self, token_id: int) -> bool:
        """True for control, user-defined and unknown tokens (matched as whole tokens)."""
        return self._types[token_id] in (CONTROL, USER_DEFINED, UNKNOWN)

    def is_eog(self, token_id: int) -> bool:
        return token_id in self.eog_ids

    def _is_control(self, token_id: int) -> bool:
        return self._types[token_id] in (CONTROL, UNKNOWN)

    def incremental_decoder(self) -> IncrementalDecoder:
        return IncrementalDecoder(self)


class TokenBytes(Protocol):
    """What IncrementalDecoder needs of a tokenizer (ours or DeepSeek V4's)."""

    def token_bytes(self, token_id: int) -> bytes: ...


class IncrementalDecoder:
    """Streams token ids to text, holding back an incomplete UTF-8 sequence until the
    token that completes it arrives (a character may span several byte tokens)."""

    def __init__(self, tokenizer: TokenBytes) -> None:
        self._tokenizer = tokenizer
        self._utf8 = codecs.getincrementaldecoder("utf-8")(errors="replace")

    def feed(self, token_id: int) -> str:
        return self._utf8.decode(self._tokenizer.token_bytes(token_id))

    def flush(self) -> str:
        """Whatever is still held (an unfinished sequence becomes U+FFFD); resets."""
        text = self._utf8.decode(b"", final=True)
        self._utf8.reset()
        return text
