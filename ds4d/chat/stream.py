"""Incremental parsing of generated text into events.

Decoded text arrives piece by piece (a piece may end in the middle of a tag). Three
stages, each holding back only what could still turn out to be markup:

    StopMatcher  -> ThinkSplitter -> ToolCallParser (text mode, tools active only)

so a stop sequence is never shown, `<think>`/`</think>` never leak into either channel,
and `<tool_call>…</tool_call>` markup never reaches the content, however the pieces split.
"""

from __future__ import annotations

import json
import re
import secrets

from ds4d.chat.types import (
    Event,
    ReasoningDelta,
    TextDelta,
    ToolCallArgsDelta,
    ToolCallEnd,
    ToolCallStart,
)

THINK_OPEN = "<think>"
THINK_CLOSE = "</think>"
TOOL_OPEN = "<tool_call>"
TOOL_CLOSE = "</tool_call>"


def partial_suffix_len(text: str, marker: str) -> int:
    """Length of the longest suffix of `text` that is a proper prefix of `marker`."""
    for n in range(min(len(marker) - 1, len(text)), 0, -1):
        if text.endswith(marker[:n]):
            return n
    return 0


def new_tool_call_id(prefix: str = "call_") -> str:
    """Unguessable: 128 random bits."""
    return prefix + secrets.token_hex(16)


class StopMatcher:
    """Finds client stop sequences in the generated text, holding back possible starts."""

    def __init__(self, stops: list[str]) -> None:
        self.stops = [s for s in stops if s]
        self.hold = max((len(s) for s in self.stops), default=1) - 1
        self.buf = ""
        self.hit: str | None = None  # the stop sequence found

    def feed(self, piece: str) -> str:
        if not self.stops:
            return piece
        self.buf += piece
        found = [(i, s) for s in self.stops if (i := self.buf.find(s)) >= 0]
        if found:
            cut, self.hit = min(found)
            out, self.buf = self.buf[:cut], ""
            return out
        n = len(self.buf) - self.hold
        if n <= 0:
            return ""
        out, self.buf = self.buf[:n], self.buf[n:]
        return out

    def flush(self) -> str:
        out, self.buf = self.buf, ""
        return out


class ThinkSplitter:
    """Splits `<think>reasoning</think>answer` into reasoning and text pieces."""

    def __init__(self, in_reasoning: bool = False) -> None:
        self.in_reasoning = in_reasoning
        self.at_start = True  # a leading <think> opens reasoning
        self.after_close = False  # blank lines right after </think> are layout
        self.buf = ""

    def feed(self, piece: str) -> list[tuple[str, str]]:
        """Returns (channel, text) pairs; channel is "reasoning" or "text"."""
        self.buf += piece
        out: list[tuple[str, str]] = []
        while self.buf:
            if self.in_reasoning:
                i = self.buf.find(THINK_CLOSE)
                if i >= 0:
                    out.append(("reasoning", self.buf[:i]))
                    self.buf = self.buf[i + len(THINK_CLOSE) :]
                    self.in_reasoning = False
                    self.at_start = False
                    self.after_close = True
                    continue
                keep = partial_suffix_len(self.buf, THINK_CLOSE)
                out.append(("reasoning", self.buf[: len(self.buf) - keep]))
                self.buf = self.buf[len(self.buf) - keep :]
                break
            if self.at_start:
                stripped = self.buf.lstrip()
                if stripped.startswith(THINK_OPEN):
                    self.buf = stripped[len(THINK_OPEN) :]
                    self.in_reasoning = True
                    self.at_start = False
                    continue
                if not stripped or THINK_OPEN.startswith(stripped):
                    break  # could still become <think>
                self.at_start = False
            if self.after_close:
                self.buf = self.buf.lstrip()
                if not self.buf:
                    break
                self.after_close = False
            out.append(("text", self.buf))
            self.buf = ""
        return [(c, t) for c, t in out if t]

    def flush(self) -> list[tuple[str, str]]:
        out, self.buf = self.buf, ""
        if not out:
            return []
        return [("reasoning" if self.in_reasoning else "text", out)]


# `{"name": "x", "arguments": ` — once seen, the call is announced and its arguments
# stream as they are generated.
_NAME = r'"((?:[^"\\]|\\.)*)"'
_CALL_HEAD = re.compile(r'\s*\{\s*"name"\s*:\s*' + _NAME + r'\s*,\s*"arguments"\s*:\s*')


def _prefixes_of(atoms: list[str]) -> re.Pattern[str]:
    """A regex matching any prefix of the concatenation of `atoms` (each a regex)."""
    pattern = ""
    for atom in reversed(atoms):
        pattern = f"(?:{atom}{pattern})?"
    return re.compile(r"\s*" + pattern + r"\Z")


_CALL_HEAD_PREFIX = _prefixes_of(
    [r"\{", r"\s*", '"', *"name", '"', r"\s*", ":", r"\s*", '"', r'(?:[^"\\]|\\.)*\\?',
     '"', r"\s*", ",", r"\s*", '"', *"arguments", '"', r"\s*", ":", r"\s*"])


class ToolCallParser:
    """Hermes-style `<tool_call>{"name": …, "arguments": {…}}</tool_call>` in answer text.

    Text outside the markup passes through; whitespace right before a tool call is
    syntax, so trailing whitespace is held until something other than a tool call
    follows. A call written name-first (as models are shown) is announced as soon as its
    name is complete and its argument JSON streams as it is generated, holding back only
    a final `}` that may close the wrapper; other layouts are parsed whole at the closing
    tag. A block whose JSON does not parse is returned as text (never lost)."""

    def __init__(self, id_prefix: str = "call_") -> None:
        self.id_prefix = id_prefix
        self.buf = ""
        self.in_call = False
        self.count = 0
        self.calls: list[tuple[str, str, str]] = []  # (id, name, arguments)
        self._live: tuple[int, str] | None = None  # (index, id) of the call streaming now
        self._args_start = 0  # where its arguments begin in the call body
        self._args_sent = 0  # argument characters already emitted
        self._whole = False  # this call is parsed whole at its closing tag

    def feed(self, piece: str) -> list[Event]:
        self.buf += piece
        out: list[Event] = []
        while self.buf:
            if self.in_call:
                i = self.buf.find(TOOL_CLOSE)
                if i < 0:
                    out.extend(self._stream_args(self.buf, final=False))
                    break
                body, rest = self.buf[:i], self.buf[i + len(TOOL_CLOSE) :]
                self.buf = rest
                out.extend(self._close_call(body, closed=True))
                continue
            i = self.buf.find(TOOL_OPEN)
            if i >= 0:
                text = self.buf[:i].rstrip()
                if text:
                    out.append(TextDelta(text))
                self.buf = self.buf[i + len(TOOL_OPEN) :]
                self.in_call = True
                self._live, self._args_start, self._args_sent, self._whole = None, 0, 0, False
                continue
            keep = partial_suffix_len(self.buf, TOOL_OPEN)
            head = self.buf[: len(self.buf) - keep]
            body = head.rstrip()
            keep += len(head) - len(body)
            if body:
                out.append(TextDelta(body))
            self.buf = self.buf[len(self.buf) - keep :]
            break
        return out

    def flush(self) -> list[Event]:
        buf, self.buf = self.buf, ""
        if self.in_call:
            # The model stopped without the closing tag: accept a complete JSON body.
            return self._close_call(buf, closed=False)
        if self.count and not buf.strip():
            return []
        return [TextDelta(buf)] if buf else []

    def _stream_args(self, body: str, final: bool) -> list[Event]:
        """Announce the call once its name is known; emit new argument text."""
        out: list[Event] = []
        if self._live is None and not self._whole:
            m = _CALL_HEAD.match(body)
            rest = body[m.end() :].lstrip() if m else ""
            if m and rest:
                if rest[0] != "{":  # arguments as a string or another shape: parse whole
                    self._whole = True
                    return out
                try:
                    name = json.loads(f'"{m.group(1)}"')
                except ValueError:
                    self._whole = True
                    return out
                self._live = (self.count, new_tool_call_id(self.id_prefix))
                self.count += 1
                self._args_start = m.end() + (len(body) - m.end() - len(rest))
                out.append(ToolCallStart(self._live[0], self._live[1], name))
            elif not m and not _CALL_HEAD_PREFIX.match(body):
                self._whole = True
                return out
        if self._live is None:
            return out
        # Hold back the last "}" and what follows: it may close the wrapper object.
        end = body.rfind("}")
        if final or end < self._args_start:
            end = len(body)
        if end > self._args_start + self._args_sent:
            text = body[self._args_start + self._args_sent : end]
            self._args_sent += len(text)
            out.append(ToolCallArgsDelta(self._live[0], text))
        return out

    def _close_call(self, body: str, closed: bool) -> list[Event]:
        self.in_call = False
        out = self._stream_args(body, final=False)
        parsed = parse_tool_call_json(body)
        live, self._live = self._live, None
        if live is None:
            events = self._call_events(parsed)
            if events:
                return out + events
            return out + [TextDelta(TOOL_OPEN + body + (TOOL_CLOSE if closed else ""))]
        index, call_id = live
        # The wrapper's closing brace was held back; what lies between the streamed text
        # and it is the rest of the arguments.
        outer = body.rstrip()
        raw_end = len(outer) - 1 if outer.endswith("}") else len(body)
        tail = body[self._args_start + self._args_sent : raw_end]
        if tail:
            out.append(ToolCallArgsDelta(index, tail))
        arguments = parsed[1] if parsed is not None else "{}"
        name = parsed[0] if parsed is not None else ""
        self.calls.append((call_id, name, arguments))
        out.append(ToolCallEnd(index, arguments))
        return out

    def _call_events(self, parsed: tuple[str, str] | None) -> list[Event]:
        if parsed is None:
            return []
        name, arguments = parsed
        call_id = new_tool_call_id(self.id_prefix)
        index = self.count
        self.count += 1
        self.calls.append((call_id, name, arguments))
        return [
            ToolCallStart(index, call_id, name),
            ToolCallArgsDelta(index, arguments),
            ToolCallEnd(index, arguments),
        ]


def parse_tool_call_json(body: str) -> tuple[str, str] | None:
    """(name, compact arguments JSON) from a Hermes tool-call body, or None."""
    try:
        obj = json.loads(body)
    except ValueError:
        return None
    if not isinstance(obj, dict) or not isinstance(obj.get("name"), str):
        return None
    args = obj.get("arguments", obj.get("parameters", {}))
    if isinstance(args, str):  # some models double-encode
        try:
            args = json.loads(args)
        except ValueError:
            return None
    if not isinstance(args, dict):
        return None
    return obj["name"], json.dumps(args, ensure_ascii=False, separators=(",", ":"))


class OutputParser:
    """Whole pipeline: generated text pieces in, events out."""

    def __init__(
        self,
        *,
        tools: bool,
        stops: list[str] | None = None,
        in_reasoning: bool = False,
        id_prefix: str = "call_",
        split_thinking: bool = True,
    ) -> None:
        self.stop = StopMatcher(stops or [])
        self.think = ThinkSplitter(in_reasoning) if split_thinking else None
        self.tools = ToolCallParser(id_prefix) if tools else None

    @property
    def stopped(self) -> bool:
        """A stop sequence was generated: decoding should end."""
        return self.stop.hit is not None

    @property
    def stop_sequence(self) -> str | None:
        return self.stop.hit

    @property
    def tool_calls(self) -> int:
        return self.tools.count if self.tools else 0

    def feed(self, piece: str) -> list[Event]:
        return self._route(self._split(self.stop.feed(piece)))

    def flush(self) -> list[Event]:
        parts = self._split(self.stop.flush())
        if self.think is not None:
            parts += self.think.flush()
        events = self._route(parts)
        if self.tools:
            events.extend(self.tools.flush())
        return events

    def _split(self, text: str) -> list[tuple[str, str]]:
        if self.think is None:
            return [("text", text)] if text else []
        return self.think.feed(text)

    def _route(self, parts: list[tuple[str, str]]) -> list[Event]:
        out: list[Event] = []
        for channel, text in parts:
            if channel == "reasoning":
                out.append(ReasoningDelta(text))
            elif self.tools:
                out.extend(self.tools.feed(text))
            else:
                out.append(TextDelta(text))
        return out
