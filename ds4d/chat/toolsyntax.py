"""What every template family's tool-call syntax shares: a streaming block parser, the
rule for malformed calls, the replay record, and resuming a constraint mid-call.

A syntax (one `toolsyntax_*.py` module each) says where a call block opens and closes,
how a block parses into calls, how a forced call is written, and how the family's
template writes a past call back into the prompt. `CallParser` does the streaming:

- Text outside blocks passes through as text. Whatever could still turn out to be
  markup (a partial opening marker, a stray closing tag, whitespace before a block) is
  held back until it is known not to be.
- A block is collected whole and parsed when it closes (or when the generation ends).
  Its calls are announced then, each as ToolCallStart, one ToolCallArgsDelta with the
  whole arguments, ToolCallEnd: the events depend only on the text, never on how it
  was cut into pieces.

**Malformed calls (the markup never reaches the client).** While serving, once an
opening marker is sampled the rest of the call is constrained (`resume_constraint`, the
same steps a forced call takes), so what follows the marker is a valid call for a
declared tool. What can still go wrong is dropped, never passed through as text: a
block whose body does not parse, names a tool that was not declared, or was cut off
before its body is complete (end of sequence, max_tokens) yields no event at all, and
`CallParser.malformed` says why in one line (the serving loop logs it and records it
in the trace; the finish reason stays what ended the generation: `length` for
max_tokens, else `stop`). A block cut off after a complete body (a missing closing
tag) is accepted. Stray closing tags in text are removed. The dropping rule is what
remains when the constraint cannot take over: when the piece that completed the opening
marker already holds text past the markup the constraint would force (the model chose a
name in the same token), what the model wrote cannot be replayed into a constraint. Once a
constraint has taken over, the call is completed even past max_tokens (it is bounded by
its schema), as a forced call is. A call written inside reasoning is not a call:
reasoning is passed on verbatim (a later turn renders it back, and the prompt must
match the KV), and it never goes to the text channel. A marker of the tool's own turn
(`Syntax.enders`: the template's tool-result wrapper) ends the reply before it: the
model has begun playing the tool, and neither the marker nor what follows is text.

**Streamed blocks.** A syntax whose calls should reach the client as they are written
(DeepSeek V4's DSML) gives a `BlockStream` per block (`Syntax.block_stream`) instead of
parsing it whole: the stream reads the block piece by piece and says when a call opens,
each argument fragment as it is read, and when the call closes; the parser turns those
into the same three events, with the ids and indexes it gives every call. A streamed
block is replayed whole: each of its calls' replay record is the block's exact text.
A syntax may also keep a malformed block as text (`Syntax.malformed_as_text`, as ds4
does for DSML): what was not read as calls comes out as text, and so does the rest of
the answer.

**Replay.** The tool memory keeps, per call id, a record of the call's compact
arguments and the exact text the model sampled for it (`replay_record`). When a later
request brings the call back, the chat format renders the client's history through the
template with those arguments and then puts the sampled text back where the template
wrote its own spelling (`Syntax.template_text`), so the prompt matches the KV cache.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from ds4d.chat.constrain import Allow, Force, Step, VocabIndex
from ds4d.chat.stream import new_tool_call_id, partial_suffix_len
from ds4d.chat.types import (
    Event,
    TextDelta,
    Tool,
    ToolCall,
    ToolCallArgsDelta,
    ToolCallEnd,
    ToolCallStart,
    ToolChoice,
)

# Replay records start with this separator, which no JSON arguments text can.
REPLAY_MARK = "\x1f"


@dataclass(frozen=True)
class ParsedCall:
    name: str
    arguments: str  # compact JSON object text
    sampled: str  # the span the template's own spelling replaces on replay


class Malformed(ValueError):
    """A call block that cannot be turned into calls of declared tools."""


@dataclass(frozen=True)
class CallOpened:
    """A streamed block opened a call of the tool `name`."""

    name: str


@dataclass(frozen=True)
class ArgsText:
    """The next fragment of the open call's arguments JSON."""

    text: str


@dataclass(frozen=True)
class CallClosed:
    """The open call is complete; `arguments` is its compact arguments JSON."""

    arguments: str


CallPart = CallOpened | ArgsText | CallClosed


class BlockStream:
    """One call block read as it is generated (see "Streamed blocks" above). It is
    made after the block's opening marker and fed the text that follows."""

    done = False  # the block's closing marker was read
    malformed: str | None = None  # why the block cannot be read as calls (then `abort`)

    def feed(self, piece: str, final: bool = False) -> list[CallPart]:
        """Reads on, up to the block's end (`final`: no more text will come, hold
        nothing back)."""
        raise NotImplementedError

    @property
    def text(self) -> str:
        """The block's text so far, read or not (once `done`, the whole block and
        nothing after it); its replay record."""
        raise NotImplementedError

    @property
    def rest(self) -> str:
        """Text fed but not read: after `done`, what followed the block."""
        raise NotImplementedError

    def abort(self) -> list[CallPart]:
        """Once malformed: the parts that close the call left open (every opened call
        gets its CallClosed)."""
        raise NotImplementedError


def compact(args: Any) -> str:
    return json.dumps(args, ensure_ascii=False, separators=(",", ":"))


def template_json(value: Any) -> str:
    """`value | tojson` as chat templates write it (spaces after `,` and `:`)."""
    return json.dumps(value, ensure_ascii=False)


def replay_record(call: ParsedCall) -> str:
    return f"{REPLAY_MARK}{call.arguments}{REPLAY_MARK}{call.sampled}"


def read_replay_record(text: str) -> tuple[str, str] | None:
    """(compact arguments, sampled text) of a record, or None for plain arguments."""
    if not text.startswith(REPLAY_MARK):
        return None
    args, sep, sampled = text[1:].partition(REPLAY_MARK)
    if not sep:
        return None
    try:
        json.loads(args)
    except ValueError:
        return None
    return args, sampled


_WS = " \t\r\n"


def object_members(text: str, start: int) -> tuple[dict[str, tuple[Any, int, int]], int]:
    """The JSON object starting at `start` (after whitespace): key -> (value, start, end
    of the value's text), and the index past the object. Raises ValueError."""
    decoder = json.JSONDecoder()
    i = _skip(text, start)
    if not text.startswith("{", i):
        raise ValueError("not an object")
    i = _skip(text, i + 1)
    members: dict[str, tuple[Any, int, int]] = {}
    if text.startswith("}", i):
        return members, i + 1
    while True:
        key, i = decoder.raw_decode(text, i)
        if not isinstance(key, str):
            raise ValueError("object key is not a string")
        i = _skip(text, i)
        if not text.startswith(":", i):
            raise ValueError("missing ':'")
        i = _skip(text, i + 1)
        value, end = decoder.raw_decode(text, i)
        members[key] = (value, i, end)
        i = _skip(text, end)
        if text.startswith("}", i):
            return members, i + 1
        if not text.startswith(",", i):
            raise ValueError("missing ','")
        i = _skip(text, i + 1)


def _skip(text: str, i: int) -> int:
    while i < len(text) and text[i] in _WS:
        i += 1
    return i


def call_object(
    text: str,
    start: int,
    tools: Sequence[Tool],
    keys: tuple[str, ...] = ("arguments", "parameters"),
) -> tuple[ParsedCall, int]:
    """A `{"name": …, "arguments": {…}}` object at `start`: the call, and the index past
    it. The sampled span is the arguments' own text."""
    try:
        members, end = object_members(text, start)
    except ValueError as e:
        raise Malformed(f"the call is not valid JSON ({e})") from None
    name = check_tool(members.get("name", (None,))[0], tools)
    key = next((k for k in keys if k in members), None)
    if key is None:
        return ParsedCall(name, "{}", "{}"), end
    value, a, b = members[key]
    args = arguments_object(value)
    sampled = text[a:b] if isinstance(value, dict) else template_json(args)
    return ParsedCall(name, compact(args), sampled), end


def arguments_object(args: Any) -> dict[str, Any]:
    """Arguments as a dict (some models double-encode them as a JSON string)."""
    if isinstance(args, str):
        try:
            args = json.loads(args)
        except ValueError:
            raise Malformed("arguments are a string that is not JSON") from None
    if not isinstance(args, dict):
        raise Malformed("arguments are not a JSON object")
    return args


class Syntax:
    """One family's call syntax; subclasses fill in the markers and the hooks."""

    name = ""
    openers: tuple[str, ...] = ()  # markers that open a call block
    stray: tuple[str, ...] = ()  # closing markers removed when they appear in text
    # Markers of another party's turn (the template's tool-result wrapper): a model that
    # writes one in its reply has begun the tool's answer itself, which is not its reply.
    # The reply ends before the marker; the marker and what follows are dropped.
    enders: tuple[str, ...] = ()
    # What may never appear inside a constrained JSON string (a closing marker could
    # otherwise be spelled inside a value).
    json_markup = ""
    # A malformed block comes out as text (and so does the rest of the answer) instead
    # of being dropped.
    malformed_as_text = False
    # The whitespace that is layout around a block (held, and not text); None: any.
    space: str | None = None

    def block_stream(self, opener: str, before: str, tools: Sequence[Tool]) -> BlockStream | None:
        """A stream reading the block `opener` opens (`before`: the answer's text before
        it), for a syntax whose calls stream; None: the block is parsed whole."""
        return None

    def block_end(self, block: str, opener: str) -> int | None:
        """Index just past the end of the block (`block` starts with `opener`), or None
        while it is still open. Default: a block runs to the end of the generation."""
        return None

    def end_finder(self, opener: str) -> Callable[[str], int | None]:
        """`block_end` for one block, called with the block as it grows (a syntax may
        keep scanning state between calls)."""
        return lambda block: self.block_end(block, opener)

    def parse_block(self, block: str, opener: str, tools: Sequence[Tool]) -> list[ParsedCall]:
        raise NotImplementedError

    def reply_start(self, held: str) -> str | None:
        """For syntaxes whose call may be a bare reply (Llama's JSON): given the reply's
        first characters, the opener they begin ("" for none, None: undecided)."""
        return ""

    def forced(self, vocab: VocabIndex, tools: list[Tool], choice: ToolChoice) -> Step:
        raise NotImplementedError

    def template_text(self, name: str, arguments: dict[str, Any]) -> str:
        """How the family's template writes the replayed span of a past call."""
        return template_json(arguments)

    def constrain_open(self, vocab: VocabIndex, tools: list[Tool], sampled: str) -> Step | None:
        """The constraint for the rest of a call whose first `sampled` characters (from
        its opening marker on) the model wrote on its own, or None when it cannot be
        continued."""
        return resume_constraint(self.forced(vocab, tools, ToolChoice("required")), sampled)


def held_suffix_len(text: str, markers: Sequence[str], strays: Sequence[str] = ()) -> int:
    """Length of the longest suffix of `text` that may still become one of `markers`:
    a partial marker, or a partial marker followed by a partial stray tag (removing the
    stray once complete joins the two, and the joined text is read again)."""
    n = max((partial_suffix_len(text, m) for m in markers), default=0)
    for stray in strays:
        for q in range(1, min(len(stray), len(text))):
            if text.endswith(stray[:q]):
                p = max(partial_suffix_len(text[:-q], m) for m in markers)
                if p:
                    n = max(n, p + q)
    return n


def check_tool(name: Any, tools: Sequence[Tool]) -> str:
    if not isinstance(name, str) or not name:
        raise Malformed("the call has no tool name")
    if tools and name not in {t.name for t in tools}:
        raise Malformed(f"the call names an undeclared tool {name[:80]!r}")
    return name


class CallParser:
    """Answer text in, events out, for one syntax (see the module docstring)."""

    def __init__(self, syntax: Syntax, tools: Sequence[Tool], id_prefix: str = "call_") -> None:
        self.syntax = syntax
        self.tools = list(tools)
        self.id_prefix = id_prefix
        self.count = 0
        self.calls: list[tuple[str, str, str]] = []  # (id, name, arguments)
        self.replay: dict[str, str] = {}  # call id -> replay record
        self.raw_blocks: list[str] = []  # the exact text of each block closed by its marker
        self.malformed: str | None = None  # why the last malformed block was not calls
        self.opened = 0  # blocks opened so far (the decode constrains each new one)
        self.ended = False  # a block was closed by its closing marker
        self.returned = False  # the reply ended at one of the syntax's `enders`
        self.ender: str | None = None  # which one
        self._buf = ""
        self._opener: str | None = None  # inside a block: the marker that opened it
        self._end: Callable[[str], int | None] = lambda block: None  # ...and its end
        self._stream: BlockStream | None = None  # ...or the stream reading it
        self._block_first = 0  # index of the open block's first call
        self._at_start = True  # nothing but whitespace seen yet
        self._as_text = False  # a malformed block was kept as text: so is the rest

    @property
    def tool_calls(self) -> list[ToolCall]:
        return [ToolCall(i, n, a) for i, n, a in self.calls]

    @property
    def block_text(self) -> str:
        """The open block's text so far ("" outside a block)."""
        if self._stream is not None:
            return self._stream.text
        return self._buf if self._opener is not None else ""

    # -- streaming ------------------------------------------------------------------------

    def feed(self, piece: str) -> list[Event]:
        if self.returned:
            return []
        if self._as_text:
            return [TextDelta(piece)] if piece else []
        self._buf += piece
        out: list[Event] = []
        space = self.syntax.space
        while self._buf:
            if self._stream is not None:
                buf, self._buf = self._buf, ""
                if not self._read_stream(out, buf):
                    break
                continue
            if self._opener is not None:
                end = self._end(self._buf)
                if end is None:
                    break
                block, self._buf = self._buf[:end], self._buf[end:]
                out += self._close(block, closed=True)
                continue
            if self._at_start:
                head = self._buf.lstrip(space)
                if not head:
                    break
                opener = self.syntax.reply_start(head)
                if opener is None:
                    break  # could still become a call
                self._at_start = False
                if opener:
                    self._open(opener, self._buf.index(head[0]))
                    continue
            i, opener = self._first(self.syntax.openers)
            j, stray = self._first(self.syntax.stray)
            k, ender = self._first(self.syntax.enders)
            if ender and all(m is None or k < at for at, m in ((i, opener), (j, stray))):
                self._emit_text(out, self._buf[:k].rstrip(space))
                self._buf = ""
                self.returned = True
                self.ender = ender
                break
            if stray and (opener is None or j < i):
                # A closing tag without a block: removed, and what it separated is read
                # again as one text (markup it split is still markup).
                self._buf = self._buf[:j] + self._buf[j + len(stray) :]
                continue
            if opener is not None:
                self._emit_text(out, self._buf[:i].rstrip(space))
                self._open(opener, i)
                continue
            markers = (*self.syntax.openers, *self.syntax.stray, *self.syntax.enders)
            keep = held_suffix_len(self._buf, markers, self.syntax.stray)
            head = self._buf[: len(self._buf) - keep]
            body = head.rstrip(space)  # whitespace before a block is syntax: held
            self._emit_text(out, body)
            self._buf = self._buf[len(body) :]
            break
        return out

    def flush(self) -> list[Event]:
        out: list[Event] = []
        if self._stream is not None:
            buf, self._buf = self._buf, ""
            if not self._read_stream(out, buf, final=True):
                if self._stream is not None:
                    self._stream_malformed(out, "the reply ended inside the call block")
                return out
        if self._opener is not None:
            block, self._buf = self._buf, ""
            return self._close(block)
        space = self.syntax.space
        if self._at_start and self._buf.strip(space):
            self._at_start = False  # an undecided reply start that never became a call
        buf, self._buf = self._buf, ""
        for marker in self.syntax.stray:
            buf = buf.replace(marker, "")
        if self.count and not buf.strip(space):
            return out
        self._emit_text(out, buf)
        return out

    # -- internals --------------------------------------------------------------------

    def _first(self, markers: Sequence[str]) -> tuple[int, str | None]:
        found = [(i, m) for m in markers if (i := self._buf.find(m)) >= 0]
        if not found:
            return -1, None
        i, _ = min(found)
        return i, max((m for j, m in found if j == i), key=len)

    def _emit_text(self, out: list[Event], text: str) -> None:
        if text:
            self._at_start = False
            out.append(TextDelta(text))

    def _open(self, opener: str, at: int) -> None:
        self._stream = self.syntax.block_stream(opener, self._buf[:at], self.tools)
        # A stream is fed what follows the opening marker; a whole block keeps it.
        self._buf = self._buf[at + len(opener) :] if self._stream is not None else self._buf[at:]
        self._opener = opener
        self._end = self.syntax.end_finder(opener)
        self._block_first = self.count
        self._at_start = False
        self.opened += 1

    def _read_stream(self, out: list[Event], piece: str, final: bool = False) -> bool:
        """Feeds the open block's stream; True once the block is closed (its rest back in
        the buffer), False while it waits for more text or after it was malformed."""
        stream = self._stream
        assert stream is not None
        self._announce(out, stream.feed(piece, final))
        if stream.malformed is not None:
            self._stream_malformed(out, stream.malformed)
            return False
        if not stream.done:
            return False
        block, self._buf = stream.text, stream.rest
        self.raw_blocks.append(block)
        for call_id, _, _ in self.calls[self._block_first :]:
            self.replay[call_id] = block
        self._stream, self._opener = None, None
        self.ended = True
        return True

    def _stream_malformed(self, out: list[Event], why: str) -> None:
        """Closes the call left open; the unread text is kept as text (all of the block
        when none of its calls was announced) or dropped, as the syntax says."""
        stream = self._stream
        assert stream is not None
        text = stream.rest if self.count > self._block_first else stream.text
        self._announce(out, stream.abort())
        self._stream, self._opener = None, None
        self._malformed(out, why, text)

    def _malformed(self, out: list[Event], why: str, text: str) -> None:
        if self.syntax.malformed_as_text:
            self.malformed = f"tool call returned as text: {why}"
            self._as_text = True
            text, self._buf = text + self._buf, ""
            if text:
                out.append(TextDelta(text))
        else:
            self.malformed = f"tool call dropped: {why}"

    def _announce(self, out: list[Event], parts: list[CallPart]) -> None:
        """A stream's parts as events, with this parser's ids and indexes."""
        for part in parts:
            if isinstance(part, CallOpened):
                call_id = new_tool_call_id(self.id_prefix)
                self.calls.append((call_id, part.name, ""))
                out.append(ToolCallStart(self.count, call_id, part.name))
                self.count += 1
            elif isinstance(part, ArgsText):
                out.append(ToolCallArgsDelta(self.count - 1, part.text))
            else:
                call_id, name, _ = self.calls[-1]
                self.calls[-1] = (call_id, name, part.arguments)
                out.append(ToolCallEnd(self.count - 1, part.arguments))

    def _close(self, block: str, closed: bool = False) -> list[Event]:
        """Parses a whole block (`closed`: by its closing marker, not the reply's end)."""
        opener, self._opener = self._opener or "", None
        out: list[Event] = []
        if not block.strip():
            return out
        try:
            calls = self.syntax.parse_block(block, opener, self.tools)
            if not calls:
                raise Malformed("the call block holds no call")
        except Malformed as e:
            self._malformed(out, str(e), block)
            return out
        if closed:
            self.raw_blocks.append(block)
            self.ended = True
        for call in calls:
            call_id = new_tool_call_id(self.id_prefix)
            index = self.count
            self.count += 1
            self.calls.append((call_id, call.name, call.arguments))
            self.replay[call_id] = replay_record(call)
            out += [
                ToolCallStart(index, call_id, call.name),
                ToolCallArgsDelta(index, call.arguments),
                ToolCallEnd(index, call.arguments),
            ]
        return out


# -- constraints that continue what the model started --------------------------------------


def resume_constraint(gen: Step, sampled: str) -> Step | None:
    """`gen` (a constraint from a call's opening marker on) advanced past `sampled`,
    text the model already wrote; None unless `sampled` lies within the constraint's
    first forced text (after it the model's choices begin, which text cannot replay)."""
    step = next(gen)
    if not isinstance(step, Force) or not step.text.startswith(sampled):
        gen.close()
        return None
    rest = step.text[len(sampled) :]
    return _continue(gen, Force(rest) if rest else None)


def _continue(gen: Step, first: Force | Allow | None) -> Step:
    """A constraint that yields `first` (if any), then the rest of `gen`."""
    try:
        step = first if first is not None else gen.send("")
        while True:
            text = yield step
            step = gen.send(text)
    except StopIteration:
        return


def prefixed(text: str, gen: Step) -> Step:
    """`gen` with `text` forced before it."""
    yield Force(text)
    return (yield from gen)
