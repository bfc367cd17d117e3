"""Incremental output parsing: stop sequences, <think> split, Hermes tool calls, with the
generated text cut into pieces at every possible point."""

from __future__ import annotations

import json

import pytest

from ds4d.chat.stream import OutputParser, ThinkSplitter, partial_suffix_len
from ds4d.chat.types import ReasoningDelta, TextDelta, ToolCallArgsDelta, ToolCallEnd, ToolCallStart


def run(text: str, cuts: list[int], **kw) -> tuple[list, OutputParser]:
    p = OutputParser(**kw)
    events = []
    prev = 0
    for c in [*cuts, len(text)]:
        events += p.feed(text[prev:c])
        prev = c
        if p.stopped:
            break
    events += p.flush()
    return events, p


def joined(events, kind) -> str:
    return "".join(e.text for e in events if isinstance(e, kind))


def every_split(text: str):
    for i in range(len(text) + 1):
        yield [i]
    yield list(range(len(text)))  # one character at a time


def test_partial_suffix():
    assert partial_suffix_len("abc<tool", "<tool_call>") == 5
    assert partial_suffix_len("abc", "<tool_call>") == 0
    assert partial_suffix_len("<tool_call>", "<tool_call>") == 0  # whole marker is not partial


@pytest.mark.parametrize("cuts", list(every_split("<think>a plan</think>\n\nThe answer.")))
def test_think_split_any_cut(cuts):
    text = "<think>a plan</think>\n\nThe answer."
    events, _ = run(text, cuts, tools=False)
    assert joined(events, ReasoningDelta) == "a plan"
    assert joined(events, TextDelta) == "The answer."


def test_prompt_opened_reasoning():
    s = ThinkSplitter(in_reasoning=True)
    out = s.feed("step one</th") + s.feed("ink>done") + s.flush()
    assert out == [("reasoning", "step one"), ("text", "done")]


def test_no_think_passes_text_through():
    events, _ = run("Hello <b>world</b>", [3, 7], tools=False)
    assert joined(events, TextDelta) == "Hello <b>world</b>"
    assert not any(isinstance(e, ReasoningDelta) for e in events)


TOOL_TEXT = 'Let me look.\n<tool_call>\n{"name": "ls", "arguments": {"path": "/tmp", "all": true}}\n</tool_call>'


@pytest.mark.parametrize("cuts", list(every_split(TOOL_TEXT)))
def test_tool_call_never_leaks_markup(cuts):
    events, p = run(TOOL_TEXT, cuts, tools=True)
    content = joined(events, TextDelta)
    assert content == "Let me look."
    starts = [e for e in events if isinstance(e, ToolCallStart)]
    ends = [e for e in events if isinstance(e, ToolCallEnd)]
    assert len(starts) == 1 and starts[0].name == "ls" and starts[0].id.startswith("call_")
    assert len(starts[0].id) == len("call_") + 32
    assert json.loads(ends[0].arguments) == {"path": "/tmp", "all": True}
    args = "".join(e.text for e in events if isinstance(e, ToolCallArgsDelta))
    assert json.loads(args) == {"path": "/tmp", "all": True}
    assert p.tool_calls == 1
    # order: the call's start precedes its argument deltas, which precede its end
    kinds = [type(e) for e in events if not isinstance(e, TextDelta)]
    assert kinds[0] is ToolCallStart and kinds[-1] is ToolCallEnd
    assert set(kinds[1:-1]) == {ToolCallArgsDelta}


def test_a_call_is_announced_whole_when_its_block_closes():
    p = OutputParser(tools=True)
    assert p.feed('<tool_call>\n{"name": "run", "arguments": {"cmd": "ls') == []
    assert p.feed(' -la"}}\n') == []
    end = p.feed("</tool_call>") + p.flush()
    assert [type(e) for e in end] == [ToolCallStart, ToolCallArgsDelta, ToolCallEnd]
    assert end[0].name == "run" and json.loads(end[2].arguments) == {"cmd": "ls -la"}
    assert end[1].text == end[2].arguments


@pytest.mark.parametrize(
    "body",
    [
        '{"arguments": {"x": 1}, "name": "f"}',  # name last: parsed whole
        '{"name": "f", "arguments": "{\\"x\\": 1}"}',  # double-encoded arguments
    ],
)
def test_other_layouts_parse_whole(body):
    events, p = run(f"<tool_call>{body}</tool_call>", [15, 30], tools=True)
    kinds = [type(e) for e in events]
    assert kinds == [ToolCallStart, ToolCallArgsDelta, ToolCallEnd]
    assert json.loads(events[-1].arguments) == {"x": 1} and p.tool_calls == 1


def test_two_calls_get_distinct_ids_and_indexes():
    text = (
        '<tool_call>{"name": "a", "arguments": {}}</tool_call>\n'
        '<tool_call>{"name": "b", "arguments": "{\\"x\\": 1}"}</tool_call>'
    )
    events, _ = run(text, [5, 40, 70], tools=True, id_prefix="toolu_")
    starts = [e for e in events if isinstance(e, ToolCallStart)]
    assert [s.index for s in starts] == [0, 1]
    assert [s.name for s in starts] == ["a", "b"]
    assert starts[0].id != starts[1].id and starts[0].id.startswith("toolu_")
    ends = [e for e in events if isinstance(e, ToolCallEnd)]
    assert json.loads(ends[1].arguments) == {"x": 1}
    assert joined(events, TextDelta) == ""


def test_malformed_call_is_dropped_never_returned_as_text():
    text = "ok <tool_call>{not json}</tool_call>"
    events, p = run(text, [4, 9], tools=True)
    assert joined(events, TextDelta) == "ok"
    assert p.tool_calls == 0
    assert "not valid JSON" in p.tools.malformed


def test_unterminated_call_with_complete_json_is_accepted():
    events, p = run('<tool_call>\n{"name": "f", "arguments": {"k": "v"}}\n', [], tools=True)
    assert p.tool_calls == 1
    assert joined(events, TextDelta) == ""


def test_without_tools_markup_is_plain_text():
    events, _ = run(TOOL_TEXT, [10], tools=False)
    assert joined(events, TextDelta) == TOOL_TEXT


def test_trailing_whitespace_released_at_end_without_tools_call():
    events, _ = run("done.  \n", [3], tools=True)
    assert joined(events, TextDelta) == "done.  \n"


@pytest.mark.parametrize("cuts", list(every_split("abc STOP def")))
def test_stop_sequence_truncates(cuts):
    events, p = run("abc STOP def", cuts, tools=False, stops=["STOP", "never"])
    assert joined(events, TextDelta) == "abc "
    assert p.stopped


def test_stop_sequence_inside_reasoning_also_stops():
    events, p = run("<think>x END y</think>z", [2, 12], tools=False, stops=["END"])
    assert joined(events, ReasoningDelta) == "x "
    assert joined(events, TextDelta) == ""
    assert p.stopped
