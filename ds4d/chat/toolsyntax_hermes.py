"""Hermes tool calls (Qwen 2.5 / Qwen 3, and ds4d's fallback for templates without
tools): `<tool_call>\\n{"name": "NAME", "arguments": {…}}\\n</tool_call>`, one block per
call, several blocks in a row for parallel calls."""

from __future__ import annotations

from collections.abc import Sequence

from ds4d.chat.constrain import Step, VocabIndex, forced_tool_call
from ds4d.chat.toolsyntax import Malformed, ParsedCall, Syntax, call_object
from ds4d.chat.types import Tool, ToolChoice

OPEN = "<tool_call>"
CLOSE = "</tool_call>"


def find_outside_strings(text: str, marker: str, start: int) -> int:
    """The first `marker` in `text[start:]` that is not inside a JSON string (a value
    may spell the closing tag), or -1."""
    in_string = escaped = False
    for i in range(start, len(text)):
        c = text[i]
        if in_string:
            if escaped:
                escaped = False
            elif c == "\\":
                escaped = True
            elif c == '"':
                in_string = False
        elif c == '"':
            in_string = True
        elif text.startswith(marker, i):
            return i
    return -1


class HermesSyntax(Syntax):
    name = "hermes"
    openers = (OPEN,)
    stray = (CLOSE,)

    def block_end(self, block: str, opener: str) -> int | None:
        i = find_outside_strings(block, CLOSE, len(opener))
        return None if i < 0 else i + len(CLOSE)

    def parse_block(self, block: str, opener: str, tools: Sequence[Tool]) -> list[ParsedCall]:
        body = block[len(opener) :]
        if body.endswith(CLOSE):
            body = body[: -len(CLOSE)]
        call, end = call_object(body, 0, tools)
        if body[end:].strip():
            raise Malformed("text after the call's JSON")
        return [call]

    def forced(self, vocab: VocabIndex, tools: list[Tool], choice: ToolChoice) -> Step:
        return forced_tool_call(vocab, tools, choice)
