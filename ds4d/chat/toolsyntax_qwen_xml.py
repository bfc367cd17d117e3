"""Qwen3-Coder's XML tool calls:

    <tool_call>
    <function=NAME>
    <parameter=KEY>
    VALUE
    </parameter>
    </function>
    </tool_call>

A value is raw text; its type comes from the tool's JSON schema (a string stays text,
numbers, booleans, objects and arrays are read as JSON, and a value that does not read
as its type stays text, as the model wrote it). Blocks that open straight with
`<function=` (the model skipped `<tool_call>`) are read too.
"""

from __future__ import annotations

import json
import re
from collections.abc import Sequence
from typing import Any

import numpy as np

from ds4d.chat.constrain import (
    Force,
    Step,
    VocabIndex,
    choose,
    json_value,
    offered_tools,
    raw_text,
    required_keys,
)
from ds4d.chat.toolsyntax import (
    Malformed,
    ParsedCall,
    Syntax,
    check_tool,
    compact,
    template_json,
)
from ds4d.chat.types import Tool, ToolChoice

OPEN = "<tool_call>"
CLOSE = "</tool_call>"
FUNCTION = "<function="
FUNCTION_END = "</function>"
PARAM_END = "</parameter>"

_FUNCTION = re.compile(r"<function=([^>\n]*)>(.*?)</function>", re.S)
_PARAM = re.compile(r"<parameter=([^>\n]*)>(.*?)</parameter>", re.S)


class QwenXMLSyntax(Syntax):
    name = "qwen3-coder-xml"
    openers = (OPEN, FUNCTION)
    stray = (CLOSE, FUNCTION_END, PARAM_END)
    enders = ("<tool_response>", "</tool_response>")  # its template's result wrapper
    json_markup = "<"

    def __init__(self) -> None:
        self._vocab: tuple[VocabIndex, VocabIndex, np.ndarray, np.ndarray, np.ndarray] | None = None

    def block_end(self, block: str, opener: str) -> int | None:
        close = CLOSE if opener == OPEN else FUNCTION_END
        i = block.find(close, len(opener))
        return None if i < 0 else i + len(close)

    def parse_block(self, block: str, opener: str, tools: Sequence[Tool]) -> list[ParsedCall]:
        body = block[len(OPEN) :] if opener == OPEN else block
        if body.endswith(CLOSE):
            body = body[: -len(CLOSE)]
        calls, pos = [], 0
        for m in _FUNCTION.finditer(body):
            if body[pos : m.start()].strip():
                raise Malformed("text around <function=…> in a call block")
            pos = m.end()
            name = check_tool(m.group(1).strip(), tools)
            schema = next((t.parameters for t in tools if t.name == name), {})
            calls.append(ParsedCall(name, compact(_arguments(m.group(2), schema)), m.group(0)))
        if body[pos:].strip() or not calls:
            raise Malformed("a call block without a complete <function=…>…</function>")
        return calls

    def template_text(self, name: str, arguments: dict[str, Any]) -> str:
        params = "".join(
            f"<parameter={k}>\n{_as_template_string(v)}\n</parameter>\n"
            for k, v in arguments.items()
        )
        return f"<function={name}>\n{params}</function>"

    def forced(self, vocab: VocabIndex, tools: list[Tool], choice: ToolChoice) -> Step:
        json_vocab, text_ids, first_ids, closer_ids = self._indexes(vocab)
        candidates = offered_tools(tools, choice)
        yield Force(f"{OPEN}\n{FUNCTION}")
        names = [t.name + ">\n" for t in candidates]
        picked = yield from choose(json_vocab, names)
        tool = candidates[names.index(picked)]
        schema: dict[str, Any] = tool.parameters if isinstance(tool.parameters, dict) else {}
        props: dict[str, Any] = schema.get("properties") or {}
        ends = ["\n" + PARAM_END, PARAM_END]
        for key in required_keys(schema):
            found = props.get(key)
            prop: dict[str, Any] = found if isinstance(found, dict) else {}
            yield Force(f"<parameter={key}>\n")
            options = prop.get("enum")
            if options and all(isinstance(o, str) and o for o in options):
                yield from choose(json_vocab, [o + ends[0] for o in options])
            elif prop.get("type") == "string" and "const" not in prop:
                yield from raw_text(text_ids, closer_ids, ends, first_ids)
            else:
                yield from json_value(json_vocab, prop)
                yield Force(ends[0])
            yield Force("\n")
        yield Force(f"{FUNCTION_END}\n{CLOSE}")

    def _indexes(self, vocab: VocabIndex) -> tuple[VocabIndex, np.ndarray, np.ndarray, np.ndarray]:
        """JSON values' vocabulary; raw value tokens (no `<`: a tag cannot be spelled),
        those that may start a value (not a newline, which the layout strips), and the
        tokens that start the closing tag."""
        if self._vocab is None or self._vocab[0] is not vocab:
            texts = vocab.texts
            text_ids = np.array(
                [i for text, ids in vocab.by_text.items() for i in ids if "<" not in text],
                dtype=np.int64,
            )
            first_ids = np.array(
                [i for i in text_ids if not texts[i].startswith("\n")], dtype=np.int64
            )
            closers = vocab.prefix_ids(["\n" + PARAM_END, PARAM_END])
            closers = closers[[("<" in texts[i]) for i in closers]] if closers.size else closers
            self._vocab = (vocab, vocab.with_markup(self.json_markup), text_ids, first_ids, closers)
        return self._vocab[1:]


def _arguments(body: str, schema: Any) -> dict[str, Any]:
    props = schema.get("properties") if isinstance(schema, dict) else None
    props = props if isinstance(props, dict) else {}
    args: dict[str, Any] = {}
    pos = 0
    for m in _PARAM.finditer(body):
        if body[pos : m.start()].strip():
            raise Malformed("text around <parameter=…> in a call")
        pos = m.end()
        value = m.group(2)
        value = value[1:] if value.startswith("\n") else value
        value = value[:-1] if value.endswith("\n") else value
        args[m.group(1).strip()] = _typed(value, props.get(m.group(1).strip()))
    if body[pos:].strip():
        raise Malformed("a <parameter=…> without its closing tag")
    return args


def _typed(value: str, schema: Any) -> Any:
    """The value as its schema's type says; text when it does not read as that type."""
    kind = schema.get("type") if isinstance(schema, dict) else None
    if isinstance(kind, list):
        kind = next((k for k in kind if k != "null"), None)
    if kind == "string":
        return value
    if kind == "boolean" and value.strip().lower() in ("true", "false"):
        return value.strip().lower() == "true"
    try:
        parsed = json.loads(value)
    except ValueError:
        return value
    if kind == "integer" and isinstance(parsed, float) and parsed.is_integer():
        return int(parsed)
    if kind in ("integer", "number") and not isinstance(parsed, int | float):
        return value
    if kind == "object" and not isinstance(parsed, dict):
        return value
    if kind == "array" and not isinstance(parsed, list):
        return value
    return parsed


def _as_template_string(value: Any) -> str:
    """A value as the template prints it: JSON for objects and arrays, else `|string`
    (Python's spelling: True, None)."""
    if isinstance(value, dict | list):
        return template_json(value)
    return str(value)
