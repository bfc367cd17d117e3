"""gpt-oss's harmony format: the reply is a sequence of messages, each a header naming
its channel (and, for a tool call, its recipient) and a body:

    <|channel|>analysis<|message|>…<|end|>                              -> reasoning
    <|start|>assistant<|channel|>commentary to=functions.NAME <|constrain|>json<|message|>{…}<|call|>
                                                                        -> a tool call
    <|start|>assistant<|channel|>final<|message|>…<|return|>            -> text

The recipient may also stand before the channel (` to=functions.NAME<|channel|>commentary
json`, as the template writes past calls). Commentary without a recipient is a preamble
the user may see: text. `<|call|>` and `<|return|>` end the generation (they are
end-of-generation tokens, so usually the parser never sees them). A message addressed
to anything but a declared function, a call body that is not a JSON object, and a
header cut off before its body are dropped (see `ds4d.chat.toolsyntax`). Reply text
written without any header is text.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from typing import Any

from ds4d.chat.constrain import Force, Step, VocabIndex, choose, json_value, offered_tools
from ds4d.chat.stream import new_tool_call_id
from ds4d.chat.toolsyntax import (
    Malformed,
    ParsedCall,
    Syntax,
    arguments_object,
    check_tool,
    compact,
    held_suffix_len,
    object_members,
    prefixed,
    replay_record,
    resume_constraint,
    template_json,
)
from ds4d.chat.types import (
    Event,
    ReasoningDelta,
    TextDelta,
    Tool,
    ToolCallArgsDelta,
    ToolCallEnd,
    ToolCallStart,
    ToolChoice,
)

START = "<|start|>"
CHANNEL = "<|channel|>"
MESSAGE = "<|message|>"
END = "<|end|>"
CALL = "<|call|>"
RETURN = "<|return|>"
CONSTRAIN = "<|constrain|>"
FUNCTIONS = "to=functions."

_BODY_ENDS = (END, CALL, RETURN, START, CHANNEL)
_STRAY = (MESSAGE, CONSTRAIN)
_BODY_MARKERS = _BODY_ENDS + _STRAY
_HEADER_STARTS = (CHANNEL, " to=", "to=", CONSTRAIN, START)
_CHANNEL_NAME = re.compile(re.escape(CHANNEL) + r"\s*(\w+)")
_RECIPIENT = re.compile(r"\bto=([^\s<]+)")


class HarmonySyntax(Syntax):
    name = "harmony"
    json_markup = "<"

    def __init__(self) -> None:
        self._json: tuple[VocabIndex, VocabIndex] | None = None  # (vocab, its JSON index)

    def parse_block(self, block: str, opener: str, tools: Sequence[Tool]) -> list[ParsedCall]:
        raise NotImplementedError  # HarmonyParser reads whole messages itself

    def template_text(self, name: str, arguments: dict[str, Any]) -> str:
        return f" to=functions.{name}{CHANNEL}commentary json{MESSAGE}" + template_json(arguments)

    def forced(self, vocab: VocabIndex, tools: list[Tool], choice: ToolChoice) -> Step:
        yield Force(f"{CHANNEL}commentary {FUNCTIONS}")
        yield from self._rest(vocab, tools, choice, f" {CONSTRAIN}json{MESSAGE}")

    def constrain_open(self, vocab: VocabIndex, tools: list[Tool], sampled: str) -> Step | None:
        """The header so far ends with `to=functions.`: the name and the rest follow."""
        if not sampled.endswith(FUNCTIONS):
            return None
        header = (
            f" {CONSTRAIN}json{MESSAGE}"
            if CHANNEL in sampled
            else (f"{CHANNEL}commentary {CONSTRAIN}json{MESSAGE}")
        )
        gen = self._rest(vocab, tools, ToolChoice("required"), header)
        return resume_constraint(prefixed("", gen), "")

    def _rest(self, vocab: VocabIndex, tools: list[Tool], choice: ToolChoice, header: str) -> Step:
        if self._json is None or self._json[0] is not vocab:
            self._json = (vocab, vocab.with_markup(self.json_markup))
        json_vocab = self._json[1]
        candidates = offered_tools(tools, choice)
        names = [t.name + header for t in candidates]
        picked = yield from choose(json_vocab, names)
        tool = candidates[names.index(picked)]
        yield from json_value(json_vocab, {**(tool.parameters or {}), "type": "object"})
        yield Force(CALL)


class HarmonyParser:
    """The whole reply, channel by channel (stands for both the thinking split and the
    call parser of the other syntaxes)."""

    def __init__(
        self, tools: Sequence[Tool], id_prefix: str = "call_", calls_active: bool = True
    ) -> None:
        self.tools = list(tools)
        self.calls_active = calls_active
        self.id_prefix = id_prefix
        self.count = 0
        self.calls: list[tuple[str, str, str]] = []
        self.replay: dict[str, str] = {}
        self.malformed: str | None = None
        self.opened = 0  # call headers seen (`to=functions.`)
        self.ended = False  # a call was closed with <|call|>: the turn ends with it
        self.returned = False  # the reply was closed with <|return|>
        self._buf = ""
        self._in_header = True  # the reply starts with a header
        self._first = True  # ...unless it starts with plain text
        self._header = ""
        self._route: str | None = None  # "reasoning", "text", "call", "drop"
        self._recipient = ""
        self._body = ""

    @property
    def block_text(self) -> str:
        """The header being read (for resuming a constraint on a call's header)."""
        return self._header if self._in_header else ""

    def feed(self, piece: str) -> list[Event]:
        self._buf += piece
        out: list[Event] = []
        while self._buf and not (self.ended or self.returned):
            if self._in_header:
                if self._first:
                    if any(s.startswith(self._buf) for s in _HEADER_STARTS) and not any(
                        self._buf.startswith(s) for s in _HEADER_STARTS
                    ):
                        break  # may still be a header
                    self._first = False
                    if not any(self._buf.startswith(s) for s in _HEADER_STARTS):
                        self._begin_body("", "final")  # no header: plain text
                        continue
                before = FUNCTIONS in self._header
                self._header += self._buf
                i = self._header.find(MESSAGE)
                header = self._header if i < 0 else self._header[:i]
                if FUNCTIONS in header and not before:
                    self.opened += 1
                if i < 0:
                    self._buf = ""
                    break
                self._buf = self._header[i + len(MESSAGE) :]
                self._header = ""
                self._in_header = False
                self._begin_header(header)
                continue
            ends = [(j, m) for m in _BODY_MARKERS if (j := self._buf.find(m)) >= 0]
            if not ends:
                keep = held_suffix_len(self._buf, _BODY_MARKERS, _STRAY)
                out += self._body_text(self._buf[: len(self._buf) - keep])
                self._buf = self._buf[len(self._buf) - keep :]
                break
            j, marker = min(ends)
            if marker in _STRAY:  # header markup inside a body: removed, the rest joined
                self._buf = self._buf[:j] + self._buf[j + len(marker) :]
                continue
            out += self._body_text(self._buf[:j])
            self._buf = self._buf[j + len(marker) :]
            out += self._end_message()
            if marker == CALL:
                self.ended = True
            elif marker == RETURN:
                self.returned = True
            self._in_header = True
            if marker == CHANNEL:
                self._header = CHANNEL
        return out

    def flush(self) -> list[Event]:
        if self._in_header:
            if self._first and self._buf:
                self._begin_body("", "final")
            else:
                if (self._header + self._buf).strip():
                    self.malformed = "tool call dropped: the reply ended inside a header"
                self._header = self._buf = ""
                return []
        buf, self._buf = self._buf, ""
        return self._body_text(buf) + self._end_message()

    # -- messages ---------------------------------------------------------------------

    def _begin_header(self, header: str) -> None:
        header = header.removeprefix(START)
        if header.startswith("assistant"):
            header = header[len("assistant") :]
        m = _CHANNEL_NAME.search(header)
        r = _RECIPIENT.search(header)
        self._begin_body(header, m.group(1) if m else "final", r.group(1) if r else "")

    def _begin_body(self, header: str, channel: str, recipient: str = "") -> None:
        self._in_header = False
        self._first = False
        self._header_text = header
        self._recipient = recipient
        self._body = ""
        if recipient:
            self._route = "call" if recipient.startswith("functions.") else "drop"
        else:
            self._route = "reasoning" if channel == "analysis" else "text"

    def _body_text(self, text: str) -> list[Event]:
        if not text:
            return []
        if self._route == "reasoning":
            return [ReasoningDelta(text)]
        if self._route == "text":
            return [TextDelta(text)]
        self._body += text
        return []

    def _end_message(self) -> list[Event]:
        route, self._route = self._route, None
        if route == "drop":
            self.malformed = f"tool call dropped: a message to {self._recipient[:80]!r}"
        if route != "call":
            return []
        try:
            if not self.calls_active:
                raise Malformed("tools are not active")
            call = self._call()
        except Malformed as e:
            self.malformed = f"tool call dropped: {e}"
            return []
        call_id = new_tool_call_id(self.id_prefix)
        index = self.count
        self.count += 1
        self.calls.append((call_id, call.name, call.arguments))
        self.replay[call_id] = replay_record(call)
        return [
            ToolCallStart(index, call_id, call.name),
            ToolCallArgsDelta(index, call.arguments),
            ToolCallEnd(index, call.arguments),
        ]

    def _call(self) -> ParsedCall:
        name = check_tool(self._recipient[len("functions.") :], self.tools)
        try:
            members, end = object_members(self._body, 0)
        except ValueError as e:
            raise Malformed(f"the call's arguments are not a JSON object ({e})") from None
        if self._body[end:].strip():
            raise Malformed("text after the call's arguments")
        args = arguments_object({k: v for k, (v, _, _) in members.items()})
        return ParsedCall(name, compact(args), self._header_text + MESSAGE + self._body[:end])
