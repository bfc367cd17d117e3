"""Constrained decoding of a forced tool call (tool_choice "required" or a named tool).

A small model left alone rarely writes a well-formed call, so the structure is not left
to it: the markup, the tool name (a choice among the offered names), the argument keys
(the schema's required properties, in schema order) and JSON punctuation are forced;
the model only chooses the values, from tokens that keep the JSON valid (string bodies
without quotes, backslashes or control characters; digits for numbers; one of the
literals for booleans and enums). The result always parses and always carries the
required keys.

The constraint is a generator: it yields `Force(text)` (append this text, no sampling)
or `Allow(ids)` (sample one token among these ids), and is sent the text of each
sampled token back.

The pieces below the Hermes block (`offered_tools`, `choose`, `json_value`,
`required_keys`, `raw_text`) are syntax-free: every other call syntax builds its block
from the same steps (`ds4d.chat.toolsyntax_*`, DeepSeek V4's DSML in
`ds4d.chat.deepseek4_forced`).
"""

from __future__ import annotations

import json
from collections.abc import Generator, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

import numpy as np

from ds4d.chat.types import Tool, ToolChoice

MAX_STRING_TOKENS = 24  # a value this long is closed: arguments stay short and bounded


@dataclass(frozen=True)
class Force:
    text: str


@dataclass(frozen=True)
class Allow:
    ids: np.ndarray  # int64 token ids


# A constraint: yields what the next token may be, is sent the text of the token
# sampled; a Choice returns the option it wrote.
Step = Generator["Force | Allow", str, None]
Choice = Generator["Force | Allow", str, str]


class Vocabulary(Protocol):
    """What indexing a vocabulary reads of a tokenizer (ds4d.engine's ModelTokenizer)."""

    n_vocab: int

    def is_special(self, token_id: int) -> bool: ...

    def token_bytes(self, token_id: int) -> bytes: ...


class VocabIndex:
    """Per-model lookup tables over the decoded text of every token.

    `texts[i]` is token i's text, or None for tokens that must never be sampled inside a
    call (special/control tokens, partial UTF-8 sequences)."""

    def __init__(self, texts: Sequence[str | None], markup: str = "") -> None:
        """`markup`: characters no token inside a JSON string may hold, beyond the quote,
        the backslash and control characters (a syntax whose closing tag could otherwise
        be spelled inside a value)."""
        self.texts = texts
        self.markup = markup
        self.by_text: dict[str, list[int]] = {}
        string_safe: list[int] = []
        digits: list[str] = []
        digit_ids: list[int] = []
        banned = set('"\\' + markup)
        for i, t in enumerate(texts):
            if not t or "\ufffd" in t:
                continue
            self.by_text.setdefault(t, []).append(i)
            if not banned.intersection(t) and all(ord(c) >= 32 for c in t):
                string_safe.append(i)
            if t.isascii() and t.isdigit():
                digits.append(t)
                digit_ids.append(i)
        self.string_safe = np.array(string_safe, dtype=np.int64)
        self.digits = np.array(digit_ids, dtype=np.int64)
        self.leading_digits = np.array(
            [i for i, t in zip(digit_ids, digits, strict=True) if t[0] != "0" or t == "0"],
            dtype=np.int64,
        )
        self.quote = np.array(self.by_text.get('"', []), dtype=np.int64)

    @classmethod
    def from_tokenizer(cls, tok: Vocabulary, n_logits: int | None = None) -> VocabIndex:
        """Every token's text; special tokens and partial UTF-8 sequences are None.
        `n_logits`: the model's output size, when it may differ from the vocabulary's
        (only ids both know can be sampled)."""
        n = tok.n_vocab if n_logits is None else min(tok.n_vocab, n_logits)
        return cls([_token_text(tok, i) for i in range(n)])

    def with_markup(self, markup: str) -> VocabIndex:
        """The same vocabulary for a syntax whose `markup` characters must never appear
        inside a JSON string."""
        return VocabIndex(self.texts, markup)

    def prefix_ids(self, remaining: Sequence[str]) -> np.ndarray:
        """Tokens whose text is a non-empty prefix of one of `remaining`."""
        ids: set[int] = set()
        seen: set[str] = set()
        for r in remaining:
            for n in range(1, len(r) + 1):
                p = r[:n]
                if p not in seen:
                    seen.add(p)
                    ids.update(self.by_text.get(p, ()))
        return np.array(sorted(ids), dtype=np.int64)


def _token_text(tok: Vocabulary, token: int) -> str | None:
    if tok.is_special(token):
        return None
    raw: bytes = tok.token_bytes(token)
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError:
        return None


def forced_tool_call(vocab: VocabIndex, tools: list[Tool], choice: ToolChoice) -> Step:
    """The whole `<tool_call>{"name": …, "arguments": {…}}</tool_call>` block."""
    candidates = offered_tools(tools, choice)
    yield Force('<tool_call>\n{"name": ')
    names = [json.dumps(t.name, ensure_ascii=False) for t in candidates]
    picked = yield from choose(vocab, names)
    tool = candidates[names.index(picked)]
    yield Force(', "arguments": ')
    yield from _object(vocab, tool.parameters or {})
    yield Force("}\n</tool_call>")


def offered_tools(tools: list[Tool], choice: ToolChoice) -> list[Tool]:
    """The tools a forced call may name: the named one, or any."""
    return [t for t in tools if choice.mode != "named" or t.name == choice.name]


def required_keys(schema: dict[str, Any]) -> list[str]:
    """The keys a forced call writes: the schema's required ones, in schema order (what
    the model was shown), then required keys the properties lack."""
    props = schema.get("properties") or {}
    required = [k for k in schema.get("required") or [] if isinstance(k, str)]
    return [k for k in props if k in required] + [k for k in required if k not in props]


def choose(vocab: VocabIndex, options: list[str], done: str = "") -> Choice:
    """One of `options`, spelled token by token; once one is left it is forced outright.
    An option that is a prefix of another ends the choice as soon as it is spelled.
    `done`: what the model already wrote of it."""
    while True:
        if done in options:
            return done
        remaining = [o[len(done) :] for o in options if o.startswith(done)]
        ids = vocab.prefix_ids(remaining) if len(remaining) > 1 else np.empty(0, np.int64)
        if ids.size == 0:
            yield Force(remaining[0])
            return done + remaining[0]
        done += yield Allow(ids)


def json_value(vocab: VocabIndex, schema: dict[str, Any]) -> Step:
    """One JSON value of `schema` (objects: their required keys)."""
    if not isinstance(schema, dict):
        schema = {}
    if "enum" in schema and schema["enum"]:
        yield from choose(vocab, [json.dumps(v, ensure_ascii=False) for v in schema["enum"]])
        return
    if "const" in schema:
        yield Force(json.dumps(schema["const"], ensure_ascii=False))
        return
    kind = schema.get("type")
    if isinstance(kind, list):
        kind = next((k for k in kind if k != "null"), "string")
    if kind is None:
        for key in ("anyOf", "oneOf"):
            if schema.get(key):
                yield from json_value(vocab, schema[key][0])
                return
    if kind == "object":
        yield from _object(vocab, schema)
    elif kind == "array":
        yield Force("[")
        yield from json_value(vocab, schema.get("items") or {"type": "string"})
        yield Force("]")
    elif kind in ("integer", "number"):
        yield from _number(vocab)
    elif kind == "boolean":
        yield from choose(vocab, ["true", "false"])
    elif kind == "null":
        yield Force("null")
    else:
        yield from _string(vocab)


def _object(vocab: VocabIndex, schema: dict[str, Any]) -> Step:
    props = schema.get("properties") or {}
    yield Force("{")
    for n, key in enumerate(required_keys(schema)):
        yield Force((", " if n else "") + json.dumps(key, ensure_ascii=False) + ": ")
        yield from json_value(vocab, props.get(key, {}))
    yield Force("}")


def _string(vocab: VocabIndex) -> Step:
    if not vocab.string_safe.size:
        yield Force('""')
        return
    yield Force('"')
    closers = vocab.quote
    body = vocab.string_safe
    either = np.concatenate([body, closers])
    for n in range(MAX_STRING_TOKENS):
        text = yield Allow(body if n == 0 else either)  # never an empty string
        if text == '"':
            return
    yield Force('"')


def raw_text(
    text_ids: np.ndarray,
    closer_ids: np.ndarray,
    ends: Sequence[str],
    first_ids: np.ndarray | None = None,
) -> Step:
    """A non-empty raw (unquoted) value and its closing tag, for syntaxes that write
    values as plain text between tags: the model picks body tokens (`text_ids`, which
    cannot spell a tag; `first_ids` for the first one), and ends the value by picking a
    token that starts one of the closing tags `ends` (`closer_ids`); the rest of that
    tag is forced."""
    first = text_ids if first_ids is None else first_ids
    if not first.size:
        yield Force(ends[0])
        return
    either = np.concatenate([text_ids, closer_ids])
    for n in range(MAX_STRING_TOKENS):
        text = yield Allow(first if n == 0 else either)
        end = next((e for e in ends if e.startswith(text)), None)
        if end is not None:
            yield Force(end[len(text) :])
            return
    yield Force(ends[0])


def _number(vocab: VocabIndex) -> Step:
    # One digit token: always valid JSON, and small models pick sensible small numbers.
    if vocab.leading_digits.size:
        yield Allow(vocab.leading_digits)
    else:  # a vocabulary without digit tokens: still valid
        yield Force("0")
