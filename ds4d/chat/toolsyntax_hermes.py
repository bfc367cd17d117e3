"""Hermes tool calls (Qwen 2.5 / Qwen 3, and ds4d's fallback for templates without
tools): `<tool_call>\\n{"name": "NAME", "arguments": {…}}\\n</tool_call>`, one block per
call, several blocks in a row for parallel calls."""

from __future__ import annotations

from collections.abc import Callable, Sequence

from ds4d.chat.constrain import Step, VocabIndex, forced_tool_call
from ds4d.chat.toolsyntax import Malformed, ParsedCall, Syntax, call_object
from ds4d.chat.types import Tool, ToolChoice

OPEN = "<tool_call>"
CLOSE = "</tool_call>"
# How a tool's result is wrapped in the next user turn (ds4d's Hermes block and the Qwen
# templates): written by the model, it is the model playing the tool.
RESULT_OPEN = "<tool_response>"
RESULT_CLOSE = "</tool_response>"


class _TagOutsideStrings:
    """Finds the closing tag of a block that is not inside a JSON string (a value may
    spell it), scanning each character once however the block grows."""

    def __init__(self, start: int) -> None:
        self.pos = start
        self.in_string = False
        self.escaped = False

    def __call__(self, block: str) -> int | None:
        i, n = self.pos, len(block)
        while i < n:
            c = block[i]
            if self.in_string:
                if self.escaped:
                    self.escaped = False
                elif c == "\\":
                    self.escaped = True
                elif c == '"':
                    self.in_string = False
            elif c == '"':
                self.in_string = True
            elif c == "<":
                if block.startswith(CLOSE, i):
                    return i + len(CLOSE)
                if CLOSE.startswith(block[i:]):
                    break  # a tag may be starting: look again with more text
            i += 1
        self.pos = i
        return None


class HermesSyntax(Syntax):
    name = "hermes"
    openers = (OPEN,)
    stray = (CLOSE,)
    enders = (RESULT_OPEN, RESULT_CLOSE)

    def block_end(self, block: str, opener: str) -> int | None:
        return self.end_finder(opener)(block)

    def end_finder(self, opener: str) -> Callable[[str], int | None]:
        return _TagOutsideStrings(len(opener))

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
