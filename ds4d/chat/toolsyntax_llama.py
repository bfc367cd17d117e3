"""Llama 3.1 / 3.2 / 3.3 tool calls: the whole reply is the call,

    {"name": "NAME", "parameters": {…}}

(`"arguments"` is read too; several calls may follow each other separated by `;`), or a
`<|python_tag|>` starts it: the same JSON after the tag, or a built-in tool's
`NAME.call(key="value", …)`. A reply that begins like a call (`{"name": "`) is a call;
any other reply is text from its first character on.
"""

from __future__ import annotations

import ast
import json
import re
from collections.abc import Sequence

from ds4d.chat.constrain import Force, Step, VocabIndex, choose, json_value, offered_tools
from ds4d.chat.toolsyntax import (
    Malformed,
    ParsedCall,
    Syntax,
    call_object,
    check_tool,
    compact,
    template_json,
)
from ds4d.chat.types import Tool, ToolChoice

PYTHON_TAG = "<|python_tag|>"
JSON_START = "{"  # the opener of a call that is the bare reply

_HEAD = re.compile(r'\{\s*"name"\s*:\s*"')
_HEAD_PREFIX = re.compile(r'\{(?:\s*(?:"(?:n(?:a(?:m(?:e(?:"(?:\s*(?::\s*)?)?)?)?)?)?)?)?)?\Z')
_BUILTIN = re.compile(r"\s*([A-Za-z_][\w]*)\.call\((.*)\)\s*\Z", re.S)


class LlamaSyntax(Syntax):
    name = "llama-json"
    openers = (PYTHON_TAG,)

    def reply_start(self, held: str) -> str | None:
        if _HEAD.match(held):
            return JSON_START
        if _HEAD_PREFIX.match(held):
            return None
        return ""

    def parse_block(self, block: str, opener: str, tools: Sequence[Tool]) -> list[ParsedCall]:
        body = block[len(PYTHON_TAG) :] if opener == PYTHON_TAG else block
        if opener == PYTHON_TAG and not body.lstrip().startswith("{"):
            return [_builtin_call(body, tools)]
        calls, i = [], 0
        while True:
            call, i = call_object(body, i, tools, keys=("parameters", "arguments"))
            calls.append(call)
            rest = body[i:].lstrip()
            if not rest:
                return calls
            if not rest.startswith(";"):
                raise Malformed("text after the call's JSON")
            i = len(body) - len(rest) + 1
            if not body[i:].strip():
                return calls

    def forced(self, vocab: VocabIndex, tools: list[Tool], choice: ToolChoice) -> Step:
        candidates = offered_tools(tools, choice)
        yield Force('{"name": "')
        names = [json.dumps(t.name, ensure_ascii=False)[1:] for t in candidates]
        picked = yield from choose(vocab, names)
        tool = candidates[names.index(picked)]
        yield Force(', "parameters": ')
        yield from json_value(vocab, {**(tool.parameters or {}), "type": "object"})
        yield Force("}")


def _builtin_call(body: str, tools: Sequence[Tool]) -> ParsedCall:
    """`NAME.call(key="value", …)`: keyword arguments with literal values only."""
    m = _BUILTIN.match(body)
    if m is None:
        raise Malformed("a <|python_tag|> call that is neither JSON nor NAME.call(…)")
    name = check_tool(m.group(1), tools)
    try:
        call = ast.parse(f"f({m.group(2)})", mode="eval").body
        assert isinstance(call, ast.Call) and not call.args
        args = {kw.arg: ast.literal_eval(kw.value) for kw in call.keywords if kw.arg}
    except (SyntaxError, ValueError, TypeError, AssertionError, RecursionError):
        raise Malformed("a NAME.call(…) whose arguments are not literal keywords") from None
    # The template writes built-in calls its own way: nothing to put back on replay.
    return ParsedCall(name, compact(args), template_json(args))
