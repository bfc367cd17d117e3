"""Structured output: the answer constrained to JSON, any object or one that follows a
JSON schema (Ollama's `format`, OpenAI's `response_format`, the Responses API's
`text.format`).

Built on the forced-tool-call machinery (`ds4d.chat.constrain`): a generator of
`Force(text)` / `Allow(ids)` steps over the vocabulary. Where the schema leaves no choice
(a required key, punctuation, the only type a value may have) the text is forced; where
it does, the model picks among tokens that keep the JSON valid and on the schema: which
optional property comes next or whether the object closes, an array's next item or its
end, a value's type when several are allowed, string bodies (escapes included, as whole
tokens), digits, an enum's member. Whatever the model picks, the text parses and
validates, unless the token budget cuts it short.

What a schema may use is checked first (`unsupported`): keywords the steps cannot honour
(string patterns and formats, length and range bounds, `not`, conditionals, ...) are
refused with the keyword's name rather than silently ignored.

Bounds keep a generation finite whatever the model does: a string closes after
`MAX_STRING_TOKENS` tokens, a number after `MAX_NUMBER_TOKENS`, an array without
`maxItems` after `MAX_ITEMS` items, a free-form object after `MAX_MEMBERS` members, and
free-form values (no schema) nest at most `MAX_FREE_DEPTH` deep.
"""

from __future__ import annotations

import json
import re
from collections.abc import Generator, Sequence
from typing import Any

import numpy as np

from ds4d.chat.constrain import Allow, Force, VocabIndex, choose
from ds4d.chat.types import OutputFormat

MAX_STRING_TOKENS = 128
MAX_NUMBER_TOKENS = 12
MAX_ITEMS = 64
MAX_MEMBERS = 16
MAX_FREE_DEPTH = 4

# A value step returns the text it consumed past the value's end: a number ends when the
# model picks a token that begins what follows it (`, ` or a closing bracket).
Value = Generator["Force | Allow", str, str]

# Validation keywords the steps cannot honour: a schema using one is refused.
REFUSED = (
    "pattern", "format", "minLength", "maxLength", "minimum", "maximum", "exclusiveMinimum",
    "exclusiveMaximum", "multipleOf", "uniqueItems", "contains", "minContains", "maxContains",
    "prefixItems", "additionalItems", "unevaluatedItems", "unevaluatedProperties",
    "patternProperties", "propertyNames", "minProperties", "maxProperties",
    "dependentRequired", "dependentSchemas", "dependencies", "if", "then", "else", "not",
    "$dynamicRef", "$recursiveRef",
)  # fmt: skip
# Keywords that describe without constraining: allowed beside a `$ref`.
ANNOTATIONS = {
    "$ref", "$defs", "definitions", "$schema", "$id", "$comment", "title", "description",
    "default", "examples", "deprecated", "readOnly", "writeOnly",
}  # fmt: skip
TYPES = ("object", "array", "string", "number", "integer", "boolean", "null")
KINDS = ("object", "array", "string", "number", "boolean", "null")  # integer: a number

# A string body token: plain characters and whole escapes, never a lone backslash.
_BODY = re.compile(r'(?:[^"\\\x00-\x1f]|\\(?:["\\/bfnrt]|u[0-9a-fA-F]{4}))+')


# ---- what a schema may use --------------------------------------------------------------


def unsupported(schema: Any) -> str | None:
    """Why `schema` cannot be honoured (one line naming the keyword), or None."""
    try:
        _check(schema, schema, (), "schema")
    except _Unsupported as e:
        return str(e)
    except RecursionError:
        return "the schema nests too deeply"
    return None


class _Unsupported(Exception):
    pass


def _check(schema: Any, root: Any, refs: tuple[str, ...], where: str) -> None:
    if schema is True or schema == {}:
        return
    if not isinstance(schema, dict):
        raise _Unsupported(f"{where} must be a JSON schema object")
    for key in REFUSED:
        if key in schema:
            raise _Unsupported(f"{where} uses '{key}', which constrained decoding cannot honour")
    if "$ref" in schema:
        ref = schema["$ref"]
        if set(schema) - ANNOTATIONS:
            raise _Unsupported(f"{where}: '$ref' beside other keywords is not supported")
        if ref in refs:
            raise _Unsupported(f"{where}: recursive '$ref' {ref!r} is not supported")
        _check(resolve(root, ref), root, (*refs, ref), ref)
        return
    kinds: list[str] = []
    if "enum" in schema or "const" in schema:
        values = schema["enum"] if "enum" in schema else [schema["const"]]
        if not isinstance(values, list) or not values:
            raise _Unsupported(f"{where}.enum must be a non-empty array")
        try:
            json.dumps(values, allow_nan=False)
        except ValueError:
            key = "enum" if "enum" in schema else "const"
            raise _Unsupported(f"{where}.{key} holds a number JSON cannot write") from None
        return
    kind = schema.get("type")
    if kind is not None:
        listed = kind if isinstance(kind, list) else [kind]
        for k in listed:
            if k not in TYPES:
                raise _Unsupported(f"{where}.type {k!r} is not a JSON schema type")
        kinds += listed
    all_of = schema.get("allOf")
    if all_of is not None:
        if not isinstance(all_of, list) or len(all_of) != 1:
            raise _Unsupported(f"{where} uses 'allOf' of several schemas, which is not supported")
        _check(all_of[0], root, refs, f"{where}.allOf[0]")
    for key in ("anyOf", "oneOf"):
        branches = schema.get(key)
        if branches is None:
            continue
        if not isinstance(branches, list) or not branches:
            raise _Unsupported(f"{where}.{key} must be a non-empty array")
        seen: set[str] = set()
        for n, b in enumerate(branches):
            _check(b, root, refs, f"{where}.{key}[{n}]")
            for k in _kinds(b, root):
                if k in seen:
                    raise _Unsupported(
                        f"{where}.{key}: two branches allow a {k}; ds4d tells branches "
                        "apart by their type"
                    )
                seen.add(k)
    props = schema.get("properties")
    if props is not None:
        if not isinstance(props, dict):
            raise _Unsupported(f"{where}.properties must be an object")
        for name, sub in props.items():
            _check(sub, root, refs, f"{where}.properties.{name}")
    required = schema.get("required")
    if required is not None and (
        not isinstance(required, list) or not all(isinstance(k, str) for k in required)
    ):
        raise _Unsupported(f"{where}.required must be an array of names")
    extra = schema.get("additionalProperties")
    if isinstance(extra, dict):
        _check(extra, root, refs, f"{where}.additionalProperties")
    if "items" in schema:
        if schema["items"] is False or isinstance(schema["items"], list):
            raise _Unsupported(f"{where}.items must be one schema")
        _check(schema["items"], root, refs, f"{where}.items")
    lo, hi = _item_bounds(schema)
    if lo > hi or lo > MAX_ITEMS:
        raise _Unsupported(f"{where}: minItems {lo} cannot be met (at most {MAX_ITEMS} items)")


def resolve(root: Any, ref: Any) -> Any:
    """A local `$ref` ("#/$defs/Name") in `root`."""
    if not isinstance(ref, str) or not ref.startswith("#"):
        raise _Unsupported(f"'$ref' {ref!r}: only local references ('#/...') are supported")
    node = root
    for part in ref[1:].split("/")[1:] if ref != "#" else []:
        part = part.replace("~1", "/").replace("~0", "~")
        if not isinstance(node, dict) or part not in node:
            raise _Unsupported(f"'$ref' {ref!r} does not resolve in the schema")
        node = node[part]
    return node


def _item_bounds(schema: dict[str, Any]) -> tuple[int, int]:
    lo, hi = schema.get("minItems", 0), schema.get("maxItems", MAX_ITEMS)
    if not isinstance(lo, int) or isinstance(lo, bool) or lo < 0:
        raise _Unsupported("minItems must be a non-negative integer")
    if not isinstance(hi, int) or isinstance(hi, bool) or hi < 0:
        raise _Unsupported("maxItems must be a non-negative integer")
    return lo, min(hi, MAX_ITEMS)


def _kinds(schema: Any, root: Any) -> list[str]:
    """The JSON kinds a (checked) schema's values may have."""
    return [k for k, _ in _branches(schema, root, depth=0)]


def _kind_of(value: Any) -> str:
    if isinstance(value, bool):
        return "boolean"
    if value is None:
        return "null"
    if isinstance(value, int | float):
        return "number"
    if isinstance(value, str):
        return "string"
    return "array" if isinstance(value, list) else "object"


def _branches(schema: Any, root: Any, depth: int) -> list[tuple[str, Any]]:
    """(kind, the schema a value of that kind follows) for each kind the schema allows;
    a schema without a type allows any value (free-form, nested at most MAX_FREE_DEPTH)."""
    if schema is True or not isinstance(schema, dict):
        schema = {}
    if "$ref" in schema:
        return _branches(resolve(root, schema["$ref"]), root, depth)
    if "enum" in schema or "const" in schema:
        values = schema["enum"] if "enum" in schema else [schema["const"]]
        by_kind: dict[str, list[Any]] = {}
        for v in values:
            by_kind.setdefault(_kind_of(v), []).append(v)
        return [(k, {"enum": vs}) for k, vs in by_kind.items()]
    if schema.get("allOf"):
        return _branches(schema["allOf"][0], root, depth)
    for key in ("anyOf", "oneOf"):
        if schema.get(key):
            out: list[tuple[str, Any]] = []
            for b in schema[key]:
                out += [kb for kb in _branches(b, root, depth) if kb[0] not in dict(out)]
            return out
    kind = schema.get("type")
    if kind is None:
        if any(k in schema for k in ("properties", "required", "additionalProperties")):
            kind = "object"
        elif "items" in schema:
            kind = "array"
    if kind is None:  # any value
        deep = depth >= MAX_FREE_DEPTH
        return [(k, {"type": k}) for k in KINDS if not (deep and k in ("object", "array"))]
    listed = kind if isinstance(kind, list) else [kind]
    if "integer" in listed and "number" in listed:
        listed = [k for k in listed if k != "integer"]
    return [("number" if k == "integer" else k, {**schema, "type": k}) for k in listed]


# ---- the vocabulary's JSON tokens -------------------------------------------------------


class JsonVocab:
    """The token classes JSON output is written from, over a VocabIndex (whose markup
    characters no string may hold)."""

    def __init__(self, vocab: VocabIndex) -> None:
        self.vocab = vocab
        self.markup = set(vocab.markup)
        body = [
            i
            for i, t in enumerate(vocab.texts)
            if t and "\ufffd" not in t and _BODY.fullmatch(t) and not self.markup.intersection(t)
        ]
        self.string_body = np.array(body, dtype=np.int64)
        self.quote = self.ids('"')
        self.string_step = union(self.string_body, self.quote)  # a body token or the end
        self.minus = self.ids("-")
        self.dot = self.ids(".")

    def ids(self, text: str) -> np.ndarray:
        """The tokens whose text is exactly `text`."""
        return np.array(self.vocab.by_text.get(text, []), dtype=np.int64)


def union(*ids: np.ndarray) -> np.ndarray:
    return np.unique(np.concatenate([np.asarray(i, dtype=np.int64) for i in ids]))


# ---- the steps ---------------------------------------------------------------------------


def json_output(jv: JsonVocab, fmt: OutputFormat) -> Generator[Force | Allow, str, None]:
    """The whole answer: any JSON object (`fmt.schema` None) or a value of the schema."""
    schema = fmt.schema if fmt.schema is not None else {"type": "object"}
    writer = _Writer(jv, schema)
    yield from writer.value(schema, (), 0)


def _text(value: Any) -> str:
    return json.dumps(value, ensure_ascii=False)


class _Writer:
    def __init__(self, jv: JsonVocab, root: Any) -> None:
        self.jv = jv
        self.vocab = jv.vocab
        self.root = root

    def starters(self, kind: str, schema: dict[str, Any]) -> np.ndarray:
        """The tokens a value of `kind` may begin with (single characters for brackets
        and quotes, so the value's first token is never also its continuation)."""
        if "enum" in schema:
            return self.vocab.prefix_ids([_text(v) for v in schema["enum"]])
        if kind == "object":
            return self.jv.ids("{")
        if kind == "array":
            return self.jv.ids("[")
        if kind == "string":
            return self.jv.ids('"')
        if kind == "number":
            return union(self.jv.minus, self.vocab.leading_digits)
        if kind == "boolean":
            return self.vocab.prefix_ids(["true", "false"])
        return self.vocab.prefix_ids(["null"])

    def value(self, schema: Any, follow: Sequence[str], depth: int, started: str = "") -> Value:
        """One value of `schema`; `follow`: the texts that may come right after it."""
        branches = _branches(schema, self.root, depth)
        if not started and len(branches) > 1:
            firsts = [self.starters(k, s) for k, s in branches]
            if any(f.size for f in firsts):
                started = yield Allow(union(*firsts))
        kind, sub = branches[0]
        if started:
            kind, sub = next(
                ((k, s) for k, s in branches if self.starters(k, s).size
                 and _begins(k, s, started)),
                branches[0],
            )  # fmt: skip
        return (yield from self.write(kind, sub, follow, depth, started))

    def write(
        self, kind: str, schema: dict[str, Any], follow: Sequence[str], depth: int, started: str
    ) -> Value:
        if "enum" in schema:
            yield from choose(self.vocab, [_text(v) for v in schema["enum"]], started)
            return ""
        if kind == "object":
            return (yield from self.object(schema, depth, started))
        if kind == "array":
            return (yield from self.array(schema, depth, started))
        if kind == "string":
            return (yield from self.string(started))
        if kind == "number":
            return (yield from self.number(schema.get("type") == "integer", follow, started))
        yield from choose(self.vocab, ["true", "false"] if kind == "boolean" else ["null"], started)
        return ""

    def object(self, schema: dict[str, Any], depth: int, started: str) -> Value:
        if not started:
            yield Force("{")
        props: dict[str, Any] = schema.get("properties") or {}
        required = set(schema.get("required") or [])
        extra = schema.get("additionalProperties", True)
        if not props and not required and extra is not False:
            return (yield from self.free_object(extra, depth))
        plan = [(k, k in required) for k in props]
        plan += [(k, True) for k in schema.get("required") or [] if k not in props]

        def nexts(i: int, first: bool) -> list[tuple[str, int | None]]:
            """What may come after position i: a later property (optional ones may be
            skipped, up to the next required one), or the end."""
            out: list[tuple[str, int | None]] = []
            for j in range(i, len(plan)):
                out.append((("" if first else ", ") + _text(plan[j][0]) + ": ", j))
                if plan[j][1]:
                    return out
            return [*out, ("}", None)]

        at, first, consumed = 0, True, ""
        while True:
            options = nexts(at, first)
            picked = yield from choose(self.vocab, [t for t, _ in options], consumed)
            j = dict(options)[picked]
            if j is None:
                return ""
            key = plan[j][0]
            follow = [t for t, _ in nexts(j + 1, False)]
            consumed = yield from self.value(props.get(key, {}), follow, depth + 1)
            at, first = j + 1, False

    def free_object(self, values: Any, depth: int) -> Value:
        """An object whose keys the model picks (each value of `values`, the
        additionalProperties schema, or any value)."""
        values = values if isinstance(values, dict) else {}
        t = yield Allow(union(self.jv.ids('"'), self.jv.ids("}")))
        n = 0
        while t != "}":
            yield from self.string(t)
            yield Force(": ")
            n += 1
            follow = [", ", "}"] if n < MAX_MEMBERS else ["}"]
            consumed = yield from self.value(values, follow, depth + 1)
            picked = yield from choose(self.vocab, follow, consumed)
            if picked == "}":
                return ""
            yield Force('"')
            t = '"'
        return ""

    def array(self, schema: dict[str, Any], depth: int, started: str) -> Value:
        if not started:
            yield Force("[")
        items = schema.get("items", {})
        lo, hi = _item_bounds(schema)

        def nexts(n: int) -> list[str]:
            return ([", "] if n < hi else []) + (["]"] if n >= lo else [])

        n, consumed = 0, ""
        if hi == 0:
            yield Force("]")
            return ""
        if lo == 0:  # the first item, or the end
            firsts = [self.starters(k, s) for k, s in _branches(items, self.root, depth + 1)]
            t = yield Allow(union(self.jv.ids("]"), *firsts))
            if t == "]":
                return ""
            consumed = yield from self.value(items, nexts(1), depth + 1, t)
        else:
            consumed = yield from self.value(items, nexts(1), depth + 1)
        n = 1
        while True:
            picked = yield from choose(self.vocab, nexts(n), consumed)
            if picked == "]":
                return ""
            consumed = yield from self.value(items, nexts(n + 1), depth + 1)
            n += 1

    def string(self, started: str) -> Value:
        if started != '"':
            yield Force('"')
        if not self.jv.quote.size or not self.jv.string_body.size:
            yield Force('"')
            return ""
        for _ in range(MAX_STRING_TOKENS):
            if (yield Allow(self.jv.string_step)) == '"':
                return ""
        yield Force('"')
        return ""

    def number(self, integer: bool, follow: Sequence[str], started: str) -> Value:
        """`-`? digits, then for a number `.` digits; ends by the model picking a token
        that begins what follows (returned), or at the bound (nothing consumed)."""
        vocab, jv = self.vocab, self.jv
        text = started or (yield Allow(union(jv.minus, vocab.leading_digits)))
        if text == "-":
            text += yield Allow(vocab.leading_digits)
        closers = vocab.prefix_ids(follow)
        fraction = False
        for _ in range(MAX_NUMBER_TOKENS):
            whole = text.lstrip("-")
            more = [vocab.digits if whole != "0" or fraction else np.empty(0, np.int64), closers]
            if not integer and not fraction:
                more.append(jv.dot)
            allowed = union(*more)
            if not allowed.size:  # "0" with nothing after it (a value on its own)
                return ""
            t = yield Allow(allowed)
            if t == ".":
                fraction = True
                text += t + (yield Allow(vocab.digits))
            elif t.isascii() and t.isdigit():
                text += t
            else:
                return t
        return ""


def _begins(kind: str, schema: dict[str, Any], text: str) -> bool:
    """Could a value of this branch begin with `text` (the token the model picked)?"""
    if "enum" in schema:
        return any(_text(v).startswith(text) or text.startswith(_text(v)) for v in schema["enum"])
    c = text[0]
    return {
        "object": c == "{",
        "array": c == "[",
        "string": c == '"',
        "number": c == "-" or c.isdigit(),
        "boolean": c in "tf",
        "null": c == "n",
    }[kind]
