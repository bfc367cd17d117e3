"""Incremental parsing of generated text into events.

Decoded text arrives piece by piece (a piece may end in the middle of a tag). Three
stages, each holding back only what could still turn out to be markup:

    StopMatcher  -> ThinkSplitter -> call parser (text mode, tools active only)

so a stop sequence is never shown, `<think>`/`</think>` never leak into either channel,
and tool-call markup never reaches the content, however the pieces split. The call
parsers, one per syntax, are in `ds4d.chat.toolsyntax` and the `toolsyntax_*` modules.
"""

from __future__ import annotations

import secrets
from typing import Protocol

from ds4d.chat.editlimits import EditLimits
from ds4d.chat.types import Event, ReasoningDelta, TextDelta

THINK_OPEN = "<think>"
THINK_CLOSE = "</think>"


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


class Splitter(Protocol):
    """Separates reasoning from answer text: (channel, text) pieces, channel "reasoning"
    or "text". A family with its own thinking convention brings its own."""

    buf: str  # text held back: it could still become a tag
    in_reasoning: bool  # inside the thinking block

    def feed(self, piece: str) -> list[tuple[str, str]]: ...

    def flush(self) -> list[tuple[str, str]]: ...


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


class ToolParser(Protocol):
    """The last stage: answer text in, text and tool-call events out (a syntax's
    CallParser, DeepSeek V4's DSML among them, or HarmonyParser)."""

    count: int  # calls announced so far

    def feed(self, piece: str) -> list[Event]: ...

    def flush(self) -> list[Event]: ...


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
        limits: EditLimits | None = None,
    ) -> None:
        self.stop = StopMatcher(stops or [])
        # code completion's line rules, after the stop sequences
        self.limits = limits if limits is not None and limits.active else None
        self.think: Splitter | None = ThinkSplitter(in_reasoning) if split_thinking else None
        self.tools: ToolParser | None = None
        if tools:  # Hermes calls of any tool name; a chat format sets its own parser
            from ds4d.chat.toolsyntax import CallParser  # (it builds on this module)
            from ds4d.chat.toolsyntax_hermes import HermesSyntax

            self.tools = CallParser(HermesSyntax(), [], id_prefix)

    @property
    def stopped(self) -> bool:
        """A stop sequence was generated (or a line rule hit): decoding should end."""
        return self.stop.hit is not None or (
            self.limits is not None and self.limits.hit is not None
        )

    @property
    def stop_sequence(self) -> str | None:
        return self.stop.hit

    @property
    def tool_calls(self) -> int:
        return self.tools.count if self.tools else 0

    @property
    def held(self) -> str:
        """Text fed in but held by the stages before the call parser (a possible stop
        sequence, a possible `</think>`)."""
        return self.stop.buf + (self.think.buf if self.think is not None else "")

    def feed(self, piece: str) -> list[Event]:
        text = self.stop.feed(piece)
        if self.limits is not None:
            text = self.limits.feed(text)
        return self._route(self._split(text))

    def flush(self) -> list[Event]:
        text = self.stop.flush()
        if self.limits is not None:
            text = self.limits.feed(text) + self.limits.flush()
        parts = self._split(text)
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
