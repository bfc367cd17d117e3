"""Mistral tool calls, both generations after the `[TOOL_CALLS]` marker:

    [TOOL_CALLS][{"name": "NAME", "arguments": {…}}, …]      Mistral Nemo (a JSON list)
    [TOOL_CALLS]NAME[ARGS]{…}[TOOL_CALLS]NAME[ARGS]{…}       Devstral, Mistral Small 3.2
                                                            (optionally NAME[CALL_ID]id)

Everything from the marker to the end of the generation is the call section; both
spellings are read whichever the template uses, forced calls are written in the
template's own.
"""

from __future__ import annotations

import json
import re
from collections.abc import Sequence

from ds4d.chat.constrain import Force, Step, VocabIndex, choose, json_value, offered_tools
from ds4d.chat.toolsyntax import (
    Malformed,
    ParsedCall,
    Syntax,
    arguments_object,
    call_object,
    check_tool,
    compact,
    object_members,
)
from ds4d.chat.types import Tool, ToolChoice

TOOL_CALLS = "[TOOL_CALLS]"
ARGS = "[ARGS]"
CALL_ID = "[CALL_ID]"

_NAMED = re.compile(r"\s*([^\s\[\]{}]+)\s*(?:\[CALL_ID\]\s*[^\s\[]*\s*)?\[ARGS\]")


class MistralSyntax(Syntax):
    name = "mistral"
    openers = (TOOL_CALLS,)
    stray = (ARGS, CALL_ID)  # only meaningful after [TOOL_CALLS]

    def __init__(self, named: bool) -> None:
        self.named = named  # the template writes NAME[ARGS]{…} (else a JSON list)
        self.name = "mistral-args" if named else "mistral-json"

    def parse_block(self, block: str, opener: str, tools: Sequence[Tool]) -> list[ParsedCall]:
        calls: list[ParsedCall] = []
        for part in block.split(TOOL_CALLS)[1:]:
            if part.lstrip().startswith("["):
                calls += _json_list(part, tools)
            else:
                calls.append(_named(part, tools))
        return calls

    def forced(self, vocab: VocabIndex, tools: list[Tool], choice: ToolChoice) -> Step:
        candidates = offered_tools(tools, choice)
        if self.named:
            yield Force(TOOL_CALLS)
            names = [t.name + ARGS for t in candidates]
            picked = yield from choose(vocab, names)
            tool = candidates[names.index(picked)]
            yield from json_value(vocab, {**(tool.parameters or {}), "type": "object"})
            return
        yield Force(TOOL_CALLS + '[{"name": ')
        names = [json.dumps(t.name, ensure_ascii=False) for t in candidates]
        picked = yield from choose(vocab, names)
        tool = candidates[names.index(picked)]
        yield Force(', "arguments": ')
        yield from json_value(vocab, {**(tool.parameters or {}), "type": "object"})
        yield Force("}]")


def _json_list(part: str, tools: Sequence[Tool]) -> list[ParsedCall]:
    i = part.index("[") + 1
    calls = []
    while True:
        call, i = call_object(part, i, tools, keys=("arguments",))
        calls.append(call)
        rest = part[i:].lstrip()
        if rest.startswith("]"):
            if rest[1:].strip():
                raise Malformed("text after the call list")
            return calls
        if not rest.startswith(","):
            raise Malformed("the call list is not valid JSON")
        i = len(part) - len(rest) + 1


def _named(part: str, tools: Sequence[Tool]) -> ParsedCall:
    m = _NAMED.match(part)
    if m is None:
        raise Malformed("[TOOL_CALLS] not followed by NAME[ARGS]")
    name = check_tool(m.group(1), tools)
    try:
        members, end = object_members(part, m.end())
    except ValueError as e:
        raise Malformed(f"the arguments are not a JSON object ({e})") from None
    if part[end:].strip():
        raise Malformed("text after the call's arguments")
    args = arguments_object({k: v for k, (v, _, _) in members.items()})
    start = len(part[: m.end()]) + (len(part[m.end() :]) - len(part[m.end() :].lstrip()))
    return ParsedCall(name, compact(args), part[start:end])
