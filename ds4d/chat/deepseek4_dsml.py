"""DSML, DeepSeek V4's tool-call syntax: rendering calls into a prompt, parsing them out
of generated text incrementally (one more `Syntax` of the shared call parser in
`ds4d.chat.toolsyntax`, whose blocks are streamed), and tracking where sampling must be
greedy.

    <｜DSML｜tool_calls>
    <｜DSML｜invoke name="NAME">
    <｜DSML｜parameter name="KEY" string="true">raw text</｜DSML｜parameter>
    <｜DSML｜parameter name="KEY" string="false">{"json": 1}</｜DSML｜parameter>
    </｜DSML｜invoke>
    </｜DSML｜tool_calls>

The parser also accepts the two degraded spellings models sometimes produce: a "short"
marker without the first bar (`<DSML｜tool_calls>`) and plain XML (`<tool_calls>`).
"""

from __future__ import annotations

import enum
import json
import re
from collections.abc import Sequence
from dataclasses import dataclass, field

from ds4d.chat.stream import partial_suffix_len
from ds4d.chat.toolsyntax import (
    ArgsText,
    BlockStream,
    CallClosed,
    CallOpened,
    CallParser,
    CallPart,
    Malformed,
    ParsedCall,
    Syntax,
    check_tool,
)
from ds4d.chat.types import Tool, ToolCall

DSML = "｜DSML｜"
# Tag-name prefixes of the three dialects, in the order ds4 prefers them.
DIALECTS: tuple[str, ...] = (DSML, "DSML｜", "")
PARAM_END = f"</{DSML}parameter>"

_ENTITIES = {"&amp;": "&", "&lt;": "<", "&gt;": ">", "&quot;": '"', "&apos;": "'"}
_ENTITY_RE = re.compile("|".join(_ENTITIES))
_LONGEST_ENTITY = max(len(e) for e in _ENTITIES)
_JSON = json.JSONDecoder()
_WS = " \t\r\n"


# ---- rendering (history -> prompt) -----------------------------------------------------


def attr_escape(s: str) -> str:
    return s.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;").replace('"', "&quot;")


def entity_decode(s: str) -> str:
    return _ENTITY_RE.sub(lambda m: _ENTITIES[m.group()], s)


def minify_json(raw: str) -> str:
    """`raw` with the whitespace outside JSON strings removed (nothing else checked)."""
    out: list[str] = []
    in_string = escaped = False
    for c in raw:
        if in_string:
            out.append(c)
            if escaped:
                escaped = False
            elif c == "\\":
                escaped = True
            elif c == '"':
                in_string = False
        elif c == '"':
            in_string = True
            out.append(c)
        elif c not in _WS:
            out.append(c)
    return "".join(out)


def json_object_members(text: str) -> list[tuple[str, str, bool]] | None:
    """Top-level members of a JSON object, in their own order, duplicates kept:
    (key, value, is_string) where a string value is decoded and any other value is its
    minified JSON text. None when `text` is not a JSON object."""
    i = _skip_ws(text, 0)
    if i >= len(text) or text[i] != "{":
        return None
    members: list[tuple[str, str, bool]] = []
    i = _skip_ws(text, i + 1)
    try:
        while i < len(text) and text[i] != "}":
            key, i = _JSON.raw_decode(text, i)
            if not isinstance(key, str):
                return None
            i = _skip_ws(text, i)
            if i >= len(text) or text[i] != ":":
                return None
            start = _skip_ws(text, i + 1)
            value, i = _JSON.raw_decode(text, start)
            if isinstance(value, str):
                members.append((key, value, True))
            else:
                members.append((key, minify_json(text[start:i]), False))
            i = _skip_ws(text, i)
            if i < len(text) and text[i] == ",":
                i = _skip_ws(text, i + 1)
    except ValueError:
        return None
    if i >= len(text) or text[i] != "}" or text[i + 1 :].strip(_WS):
        return None
    return members


def _skip_ws(text: str, i: int) -> int:
    while i < len(text) and text[i] in _WS:
        i += 1
    return i


def _parameter(key: str, value: str, is_string: bool) -> str:
    if is_string:
        body = value.replace(PARAM_END, "&lt;" + PARAM_END[1:])
    else:
        body = value.replace(PARAM_END, "\\u003c" + PARAM_END[1:])
    flag = "true" if is_string else "false"
    return f'<{DSML}parameter name="{attr_escape(key)}" string="{flag}">{body}{PARAM_END}\n'


def render_tool_calls(calls: Sequence[ToolCall]) -> str:
    """The canonical DSML block for an assistant turn's calls (with its leading blank
    line); arguments keep their own key order, non-string values are minified."""
    if not calls:
        return ""
    parts = [f"\n\n<{DSML}tool_calls>\n"]
    for call in calls:
        parts.append(f'<{DSML}invoke name="{attr_escape(call.name)}">\n')
        members = json_object_members(call.arguments)
        if members is None:  # not an object: keep the raw text as one string
            parts.append(_parameter("arguments", call.arguments, True))
        else:
            parts.extend(_parameter(k, v, s) for k, v, s in members)
        parts.append(f"</{DSML}invoke>\n")
    parts.append(f"</{DSML}tool_calls>")
    return "".join(parts)


# ---- incremental parsing (generated text -> events) -----------------------------------


def _tags(prefix: str) -> dict[str, str]:
    return {
        "start": f"<{prefix}tool_calls>",
        "end": f"</{prefix}tool_calls>",
        "invoke": f"<{prefix}invoke",
        "invoke_end": f"</{prefix}invoke>",
        "param": f"<{prefix}parameter",
        "param_end": f"</{prefix}parameter>",
    }


_TAGS = {p: _tags(p) for p in DIALECTS}
_STARTS = [(p, _TAGS[p]["start"]) for p in DIALECTS]


def _attr(tag: str, name: str) -> str | None:
    """Entity-decoded value of attribute `name` inside an opening tag, or None."""
    key = f'{name}="'
    i = tag.find(key)
    if i < 0:
        return None
    j = tag.find('"', i + len(key))
    if j < 0:
        return None
    return entity_decode(tag[i + len(key) : j])


def _find_start(text: str) -> tuple[int, str] | None:
    """Earliest tool-block start marker in `text`: (position, dialect prefix)."""
    best: tuple[int, str] | None = None
    for prefix, marker in _STARTS:
        i = text.find(marker)
        if i >= 0 and (best is None or i < best[0]):
            best = (i, prefix)
    return best


@dataclass
class _Container:
    """An invoke's arguments, or the object of a loose nested parameter."""

    name: str
    members: list[tuple[str, str]] = field(default_factory=list)  # (key, JSON value)


@dataclass
class _Leaf:
    key: str
    is_string: bool
    raw: list[str] = field(default_factory=list)
    emitted: bool = False  # non-string: something besides whitespace was streamed


class DSMLSyntax(Syntax):
    """DSML as a syntax of the shared call parser: blocks are streamed (each invoke is
    announced when its tag is read, and its arguments JSON is streamed as the
    parameters arrive), and a malformed block comes back as text, as ds4 returns
    invalid tool calls as text. Forced calls are written by `deepseek4_forced`."""

    name = "dsml"
    openers = tuple(marker for _, marker in _STARTS)
    json_markup = "<"
    malformed_as_text = True
    space = _WS

    def block_stream(self, opener: str, before: str, tools: Sequence[Tool]) -> BlockStream:
        prefix = next(p for p, marker in _STARTS if marker == opener)
        # The replayable block includes the blank line ds4's canonical form starts with.
        lead = "\n\n" if before.endswith("\n\n") else ""
        return DSMLBlock(_TAGS[prefix], lead, tools)

    def parse_block(self, block: str, opener: str, tools: Sequence[Tool]) -> list[ParsedCall]:
        stream = self.block_stream(opener, "", tools)
        parts = stream.feed(block[len(opener) :], final=True)
        if stream.malformed is not None or not stream.done:
            raise Malformed(stream.malformed or "the call block is not closed")
        return [
            ParsedCall(opened.name, closed.arguments, block)
            for opened, closed in zip(
                [p for p in parts if isinstance(p, CallOpened)],
                [p for p in parts if isinstance(p, CallClosed)],
                strict=True,
            )
        ]


class DSMLBlock(BlockStream):
    """One DSML block read as it arrives, after its start tag: per invoke a CallOpened,
    argument fragments whose concatenation is the arguments JSON, and a CallClosed with
    the compact arguments. However the text is split into pieces, the parts carry the
    same text: a partial tag or entity waits for the rest."""

    def __init__(self, tags: dict[str, str], lead: str, tools: Sequence[Tool]) -> None:
        self.tags = tags
        self.tools = tools
        self._buf = ""
        self._raw: list[str] = [lead + tags["start"]]  # the block's text read so far
        self._invoke: _Container | None = None
        self._object: _Container | None = None  # a loose nested parameter's object
        self._leaf: _Leaf | None = None

    @property
    def text(self) -> str:
        return "".join(self._raw) + ("" if self.done else self._buf)

    @property
    def rest(self) -> str:
        return self._buf

    def feed(self, piece: str, final: bool = False) -> list[CallPart]:
        self._buf += piece
        out: list[CallPart] = []
        try:
            while not self.done and self._step(out, final):
                pass
        except Malformed as e:
            self.malformed = str(e)
        return out

    # -- one step consumes some input, or returns False to wait for more --------------

    def _step(self, out: list[CallPart], final: bool) -> bool:
        if self._leaf is not None:
            return self._leaf_step(out, final)
        self._consume(len(self._buf) - len(self._buf.lstrip(_WS)))
        if not self._buf:
            return False
        if self._object is not None:
            return self._object_step(out)
        if self._invoke is not None:
            return self._invoke_step(out)
        return self._block_step(out)

    def _block_step(self, out: list[CallPart]) -> bool:
        tags = self.tags
        if self._buf.startswith(tags["end"]):
            self._consume(len(tags["end"]))
            self.done = True
            return False
        if not self._buf.startswith(tags["invoke"]):
            return self._wait(tags["end"], tags["invoke"])
        tag = self._tag()
        if tag is None:
            return False
        name = check_tool(_attr(tag, "name"), self.tools)
        self._invoke = _Container(name)
        out += [CallOpened(name), ArgsText("{")]
        return True

    def _invoke_step(self, out: list[CallPart]) -> bool:
        tags = self.tags
        if self._buf.startswith(tags["invoke_end"]):
            self._consume(len(tags["invoke_end"]))
            self._end_invoke(out)
            return True
        if self._buf.startswith(tags["param"]):
            return self._open_param(out)
        return self._wait(tags["invoke_end"], tags["param"])

    def _object_step(self, out: list[CallPart]) -> bool:
        tags = self.tags
        if self._buf.startswith(tags["param"]):
            return self._open_param(out)
        # The object ends at anything that is not an inner parameter; its own closing
        # tag is optional.
        if self._buf.startswith(tags["param_end"]):
            self._consume(len(tags["param_end"]))
        elif not self._buf.startswith(tags["invoke_end"]):
            return self._wait(tags["param"], tags["param_end"], tags["invoke_end"])
        self._close_object(out)
        return True

    def _open_param(self, out: list[CallPart]) -> bool:
        tags = self.tags
        assert self._invoke is not None
        end = self._buf.find(">")
        if end < 0:
            return False
        tag = self._buf[: end + 1]
        key = _attr(tag, "name")
        if key is None:
            raise Malformed("a parameter without a name")
        flag = _attr(tag, "string")
        container = self._object or self._invoke
        if flag is None and self._object is None:
            # ds4's loose-XML recovery: a parameter without `string` whose body opens
            # another parameter holds a flat object of those parameters.
            rest = self._buf[end + 1 :].lstrip(_WS)
            if tags["param"].startswith(rest):
                return False  # cannot tell yet
            if rest.startswith(tags["param"]):
                self._consume(end + 1)
                self._emit_key(out, container, key, "{")
                self._object = _Container(key)
                return True
        self._consume(end + 1)
        self._leaf = _Leaf(key, flag != "false")
        self._emit_key(out, container, key, '"' if self._leaf.is_string else "")
        return True

    def _emit_key(self, out: list[CallPart], container: _Container, key: str, opener: str) -> None:
        sep = "," if container.members else ""
        out.append(ArgsText(sep + json.dumps(key, ensure_ascii=False) + ":" + opener))

    def _leaf_step(self, out: list[CallPart], final: bool) -> bool:
        leaf, tags = self._leaf, self.tags
        assert leaf is not None
        end_tag = tags["param_end"]
        i = self._buf.find(end_tag)
        if i >= 0:
            body = self._buf[:i]
        else:
            keep = 0 if final else partial_suffix_len(self._buf, end_tag)
            body = self._buf[: len(self._buf) - keep]
            if leaf.is_string and not final:
                body = body[: len(body) - _partial_entity_len(body)]
        self._consume(len(body))
        leaf.raw.append(body)
        if body:
            if leaf.is_string:
                frag = json.dumps(entity_decode(body), ensure_ascii=False)[1:-1]
            else:
                frag = body
                leaf.emitted = leaf.emitted or bool(body.strip(_WS))
            if frag:
                out.append(ArgsText(frag))
        if i < 0:
            return False
        self._consume(len(end_tag))
        self._close_leaf(out)
        return True

    def _close_leaf(self, out: list[CallPart]) -> None:
        leaf, inv = self._leaf, self._invoke
        assert leaf is not None and inv is not None
        value = "".join(leaf.raw)
        if leaf.is_string:
            json_value = json.dumps(entity_decode(value), ensure_ascii=False)
            out.append(ArgsText('"'))
        else:
            json_value = minify_json(value) or "null"
            if not leaf.emitted:
                out.append(ArgsText("null"))
        (self._object or inv).members.append((leaf.key, json_value))
        self._leaf = None

    def _close_object(self, out: list[CallPart]) -> None:
        obj, inv = self._object, self._invoke
        assert obj is not None and inv is not None
        pairs = ", ".join(f"{json.dumps(k, ensure_ascii=False)}: {v}" for k, v in obj.members)
        inv.members.append((obj.name, "{" + pairs + "}"))
        out.append(ArgsText("}"))
        self._object = None

    def _end_invoke(self, out: list[CallPart]) -> None:
        inv = self._invoke
        assert inv is not None
        out += [ArgsText("}"), CallClosed(compact_arguments(inv.members))]
        self._invoke = None

    def _consume(self, n: int) -> str:
        s, self._buf = self._buf[:n], self._buf[n:]
        self._raw.append(s)
        return s

    def _tag(self) -> str | None:
        """The whole opening tag at the head of the buffer, once its `>` has arrived."""
        end = self._buf.find(">")
        return None if end < 0 else self._consume(end + 1)

    def _wait(self, *expected: str) -> bool:
        if any(e.startswith(self._buf) for e in expected):
            return False  # a tag still arriving
        raise Malformed(f"unexpected text {self._buf[:40]!r} in the call block")

    def abort(self) -> list[CallPart]:
        out: list[CallPart] = []
        if self._invoke is not None:
            if self._leaf is not None:
                if self._leaf.is_string:
                    out.append(ArgsText('"'))
                elif not self._leaf.emitted:
                    out.append(ArgsText("null"))
                self._leaf = None
            if self._object is not None:
                out.append(ArgsText("}"))
                self._object = None
            self._end_invoke(out)
        return out


class DSMLToolParser(CallParser):
    """Answer text in, events out, for DSML: the shared call parser with `DSMLSyntax`
    (the text before a tool block, then per invoke a ToolCallStart, argument fragments
    whose concatenation is the arguments JSON, and a ToolCallEnd with the compact
    arguments; a malformed block comes back as text). `replay` maps each call id to the
    exact block it came from, for the tool memory (exact replay)."""

    def __init__(self, id_prefix: str = "call_") -> None:
        super().__init__(DSMLSyntax(), (), id_prefix)


def _partial_entity_len(text: str) -> int:
    """Length of a trailing `&...` that could still become one of the five entities."""
    amp = text.rfind("&", max(0, len(text) - _LONGEST_ENTITY + 1))
    if amp < 0:
        return 0
    tail = text[amp:]
    return len(tail) if any(e.startswith(tail) and e != tail for e in _ENTITIES) else 0


def parse_tool_calls(text: str) -> list[tuple[str, str, str]]:
    """(id, name, compact arguments) of the calls in a complete text (fresh ids)."""
    parser = DSMLToolParser()
    parser.feed(text)
    parser.flush()
    return parser.calls


def is_dsml_block(text: str) -> bool:
    """`text` is one whole tool block (optionally after blank lines), in any dialect."""
    body = text.lstrip("\n")
    return any(
        body.startswith(_TAGS[p]["start"]) and body.endswith(_TAGS[p]["end"]) for p in DIALECTS
    )


def compact_arguments(members: Sequence[tuple[str, str]]) -> str:
    """The client-facing arguments: compact JSON, or `{}` when a value is not valid JSON
    (as ds4 does)."""
    try:
        obj = {k: json.loads(v) for k, v in members}
    except ValueError:
        return "{}"
    return json.dumps(obj, ensure_ascii=False, separators=(",", ":"))


# ---- where sampling must be greedy ------------------------------------------------------


class DSMLState(enum.Enum):
    OUTSIDE = "outside"  # no tool block open (or the block has ended)
    STRUCTURAL = "structural"  # tags, attribute values, whitespace between tags
    STRING_BODY = "string_body"  # a string="true" parameter value
    JSON_STRUCTURAL = "json_structural"  # a JSON parameter value, outside its strings
    JSON_STRING = "json_string"  # inside a JSON string of a JSON parameter value


_PAYLOAD = (DSMLState.STRING_BODY, DSMLState.JSON_STRING)
_MAX_START = max(len(m) for _, m in _STARTS)


class DSMLTracker:
    """Classifies the position after the text generated so far, so the generation loop
    can sample the markup of a tool block greedily while parameter payloads keep the
    request's sampling. A forgiving recogniser, not a validator (the parser judges the
    block), and deliberately not gated by thinking: DSML written inside reasoning is
    tracked too.
    """

    def __init__(self) -> None:
        self.state = DSMLState.OUTSIDE
        self._text = ""
        self._pos = 0
        self._tags: dict[str, str] | None = None
        self._mode = "search"  # search | structural | string | json | done
        self._in_string = self._escaped = False

    @property
    def greedy(self) -> bool:
        """The next token is block structure: sample it with temperature 0."""
        return self.state is not DSMLState.OUTSIDE and self.state not in _PAYLOAD

    def feed(self, piece: str) -> DSMLState:
        self._text = self._text[self._pos :] + piece
        self._pos = 0
        self.state = self._scan()
        return self.state

    def _scan(self) -> DSMLState:
        text = self._text
        while True:
            if self._mode == "done":
                return DSMLState.OUTSIDE
            if self._mode == "search":
                found = _find_start(text)
                if found is None:
                    self._pos = max(0, len(text) - _MAX_START)
                    return DSMLState.OUTSIDE
                pos, prefix = found
                self._tags = _TAGS[prefix]
                self._pos = pos + len(self._tags["start"])
                self._mode = "structural"
            tags = self._tags
            assert tags is not None
            if self._mode == "string":
                i = text.find(tags["param_end"], self._pos)
                if i < 0:
                    self._pos = max(self._pos, len(text) - len(tags["param_end"]) + 1)
                    if _ends_with_partial(text, tags["param_end"]):
                        return DSMLState.STRUCTURAL
                    return DSMLState.STRING_BODY
                self._pos = i + len(tags["param_end"])
                self._mode = "structural"
            elif self._mode == "json":
                state = self._scan_json(text, tags["param_end"])
                if state is not None:
                    return state
            else:
                state = self._scan_structure(text, tags)
                if state is not None:
                    return state

    def _scan_json(self, text: str, end_tag: str) -> DSMLState | None:
        while self._pos < len(text):
            if not self._in_string and text.startswith(end_tag, self._pos):
                self._pos += len(end_tag)
                self._mode = "structural"
                return None
            c = text[self._pos]
            if not self._in_string and end_tag.startswith(text[self._pos :]):
                if len(text) - self._pos >= 2:
                    return DSMLState.STRUCTURAL  # the closing tag is arriving
                return DSMLState.JSON_STRUCTURAL
            self._pos += 1
            if self._in_string:
                if self._escaped:
                    self._escaped = False
                elif c == "\\":
                    self._escaped = True
                elif c == '"':
                    self._in_string = False
            elif c == '"':
                self._in_string = True
        return DSMLState.JSON_STRING if self._in_string else DSMLState.JSON_STRUCTURAL

    def _scan_structure(self, text: str, tags: dict[str, str]) -> DSMLState | None:
        while True:
            while self._pos < len(text) and text[self._pos] in _WS:
                self._pos += 1
            rest = text[self._pos :]
            if not rest:
                return DSMLState.STRUCTURAL
            if rest.startswith(tags["end"]):
                self._pos += len(tags["end"])
                self._mode = "done"
                return DSMLState.OUTSIDE
            if rest.startswith(tags["invoke_end"]):
                self._pos += len(tags["invoke_end"])
                continue
            opening = tags["invoke"] if rest.startswith(tags["invoke"]) else None
            if opening is None and rest.startswith(tags["param"]):
                opening = tags["param"]
            if opening is not None:
                end = rest.find(">")
                if end < 0:
                    return DSMLState.STRUCTURAL  # the tag is still arriving
                self._pos += end + 1
                if opening == tags["invoke"]:
                    continue
                self._mode = "string" if _attr(rest[: end + 1], "string") == "true" else "json"
                self._in_string = self._escaped = False
                return None
            if any(
                t.startswith(rest)
                for t in (
                    tags["end"],
                    tags["invoke"],
                    tags["invoke_end"],
                    tags["param"],
                    tags["param_end"],
                )
            ):
                return DSMLState.STRUCTURAL
            self._pos += 1  # stray text between tags: skip it


def _ends_with_partial(text: str, marker: str, min_len: int = 2) -> bool:
    return partial_suffix_len(text, marker) >= min_len
