"""DSML as a syntax of the shared call parser: whole-block parsing, the malformed note the
serving loop records, and a malformed block kept as text by a whole-block syntax."""

from __future__ import annotations

from ds4d.chat.deepseek4 import ThinkMode
from ds4d.chat.deepseek4_dsml import DSMLSyntax, render_tool_calls
from ds4d.chat.deepseek4_output import DS4Decode
from ds4d.chat.toolsyntax import CallParser, Malformed
from ds4d.chat.toolsyntax_hermes import HermesSyntax
from ds4d.chat.types import ChatRequest, Message, TextDelta, Tool, ToolCall, ToolCallEnd

CALL = ToolCall("a", "bash", '{"command": "ls", "n": 2}')


def test_a_whole_block_parses_like_the_stream():
    syntax = DSMLSyntax()
    block = render_tool_calls([CALL, ToolCall("b", "read", '{"path": "x"}')]).lstrip("\n")
    calls = syntax.parse_block(block, syntax.openers[0], [Tool("bash"), Tool("read")])
    assert [(c.name, c.arguments) for c in calls] == [
        ("bash", '{"command":"ls","n":2}'),
        ("read", '{"path":"x"}'),
    ]
    for broken in (block[:-5], block.replace("</｜DSML｜invoke>", "<x>", 1)):
        try:
            syntax.parse_block(broken, syntax.openers[0], [])
        except Malformed:
            continue
        raise AssertionError(broken)
    try:  # a declared tool list is checked
        syntax.parse_block(block, syntax.openers[0], [Tool("bash")])
        raise AssertionError("undeclared tool accepted")
    except Malformed as e:
        assert "read" in str(e)


def test_a_malformed_block_is_text_and_noted_for_the_trace():
    req = ChatRequest(messages=[Message("user", "hi")], tools=[Tool("bash")])
    decode = DS4Decode(req, ThinkMode.NONE)
    bad = "Sure.\n\n<｜DSML｜tool_calls>\n<｜DSML｜bogus>oops"
    events = decode.feed(bad) + decode.feed(render_tool_calls([CALL])) + decode.flush()
    text = "".join(e.text for e in events if isinstance(e, TextDelta))
    assert text == bad + render_tool_calls([CALL])  # the rest of the answer is text too
    assert decode.tool_calls == 0 and not decode.tool_block_closed
    assert decode.malformed is not None and decode.malformed.startswith("tool call returned")
    good = DS4Decode(req, ThinkMode.NONE)
    events = good.feed("ok" + render_tool_calls([CALL])) + good.flush()
    assert good.malformed is None and isinstance(events[-1], ToolCallEnd)
    assert list(good.replay.values()) == [render_tool_calls([CALL])]


class _HermesKeepingText(HermesSyntax):
    malformed_as_text = True


def test_a_whole_block_syntax_may_keep_malformed_blocks_as_text():
    bad = '<tool_call>\n{"name": "bash", "arguments": [1]}\n</tool_call>'
    for syntax, want in (
        (HermesSyntax(), "Hi. tail"),
        (_HermesKeepingText(), "Hi." + bad + " tail"),
    ):
        parser = CallParser(syntax, [Tool("bash")])
        events = parser.feed("Hi." + bad + " tail") + parser.flush()
        assert "".join(e.text for e in events if isinstance(e, TextDelta)) == want
        assert parser.malformed is not None and not parser.calls
