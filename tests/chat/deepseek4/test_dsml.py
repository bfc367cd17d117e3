"""DSML tool calls out of generated text: incremental parsing at any split point, the
degraded dialects, recovery, the V4 thinking split, and the forced-greedy tracker."""

from __future__ import annotations

import json
import random

import pytest

from ds4d.chat.deepseek4_dsml import DSMLState, DSMLToolParser, DSMLTracker, render_tool_calls
from ds4d.chat.deepseek4_output import ThinkSplitter, output_parser
from ds4d.chat.types import (
    ReasoningDelta,
    TextDelta,
    ToolCall,
    ToolCallArgsDelta,
    ToolCallEnd,
    ToolCallStart,
)

CALLS = [
    ToolCall(
        "x1",
        "bash",
        json.dumps(
            {
                "command": "grep -n 'a<b' *.c 2>&1 && echo \"done\" </｜DSML｜parameter>\n\tok",
                "timeout": 30,
                "env": {"LANG": "C", "list": [1, 2.5, None, True]},
                "note": "naïve 日本 🙂",
            }
        ),
    ),
    ToolCall("x2", 'read "file"', json.dumps({"path": "/tmp/a&b.txt"})),
    ToolCall("x3", "noargs", "{}"),
]
TEXT = "Let me look at the files." + render_tool_calls(CALLS)


def parse(pieces, id_prefix="call_"):
    parser = DSMLToolParser(id_prefix)
    events = []
    for piece in pieces:
        events += parser.feed(piece)
    events += parser.flush()
    return parser, events


def merged(events):
    """Events with consecutive deltas of one stream joined, ids blanked (they are random)."""
    out = []
    for e in events:
        if isinstance(e, ToolCallStart):
            e = ToolCallStart(e.index, "", e.name)
        prev = out[-1] if out else None
        if isinstance(e, (TextDelta, ReasoningDelta)) and type(prev) is type(e):
            out[-1] = type(e)(prev.text + e.text)
        elif (
            isinstance(e, ToolCallArgsDelta)
            and isinstance(prev, ToolCallArgsDelta)
            and prev.index == e.index
        ):
            out[-1] = ToolCallArgsDelta(e.index, prev.text + e.text)
        else:
            out.append(e)
    return out


def chunkings(text, seed=7, n=25):
    rng = random.Random(seed)
    yield list(text)
    for _ in range(n):
        cuts = sorted(rng.sample(range(1, len(text)), rng.randint(1, min(40, len(text) - 1))))
        yield [text[a:b] for a, b in zip([0, *cuts], [*cuts, len(text)], strict=True)]


def test_rendered_calls_round_trip_at_any_split():
    parser, whole = parse([TEXT])
    events = merged(whole)
    assert events[0] == TextDelta("Let me look at the files.")
    starts = [e for e in events if isinstance(e, ToolCallStart)]
    ends = [e for e in events if isinstance(e, ToolCallEnd)]
    assert [s.name for s in starts] == [c.name for c in CALLS]
    for call, end, delta in zip(
        CALLS, ends, [e for e in events if isinstance(e, ToolCallArgsDelta)], strict=True
    ):
        assert json.loads(end.arguments) == json.loads(call.arguments)
        assert json.loads(delta.text) == json.loads(call.arguments)  # the streamed fragments
    assert parser.raw_blocks == [render_tool_calls(CALLS)]
    assert [c.name for c in parser.tool_calls] == [c.name for c in CALLS]
    for pieces in chunkings(TEXT):
        assert merged(parse(pieces)[1]) == events


def test_call_ids_use_the_prefix_and_are_unique():
    parser, events = parse([TEXT], id_prefix="toolu_")
    ids = [e.id for e in events if isinstance(e, ToolCallStart)]
    assert all(i.startswith("toolu_") and len(i) == 6 + 32 for i in ids)
    assert len(set(ids)) == 3 and [c.id for c in parser.tool_calls] == ids


def test_partial_tags_and_entities_wait():
    parser = DSMLToolParser()
    assert parser.feed('ok\n\n<｜DSML｜tool_calls>\n<｜DSML｜invoke name="ba') == [TextDelta("ok")]
    events = parser.feed('sh">\n<｜DSML｜parameter name="c" string="true">a &amp')
    assert isinstance(events[0], ToolCallStart) and events[0].name == "bash"
    assert "".join(e.text for e in events[1:]) == '{"c":"a '  # `&amp` held back
    events = parser.feed("; b</｜DSML｜para")
    assert "".join(e.text for e in events) == "& b"  # the closing tag is held
    events = parser.feed("meter>\n</｜DSML｜invoke>\n</｜DSML｜tool_calls>")
    assert events[-1] == ToolCallEnd(0, '{"c":"a & b"}')
    assert parser.ended and not parser.malformed


def test_text_whitespace_before_a_block_is_not_content():
    _, events = parse(list("I will inspect the files.  \n\n" + render_tool_calls(CALLS[2:])))
    assert merged(events)[0] == TextDelta("I will inspect the files.")
    # ... but whitespace inside text, or at the end without a block, is kept.
    assert merged(parse(list("a  \n b \n"))[1]) == [TextDelta("a  \n b \n")]
    assert merged(parse(["x < y and <b>"])[1]) == [TextDelta("x < y and <b>")]


@pytest.mark.parametrize(
    "opening, closing",
    [
        ("<DSML｜tool_calls>", "</DSML｜tool_calls>"),
        ("<tool_calls>", "</tool_calls>"),
    ],
)
def test_degraded_dialects(opening, closing):
    p = opening[1 : -len("tool_calls>")]
    text = (
        f'{opening}\n<{p}invoke name="ls">\n<{p}parameter name="dir" string="true">/tmp'
        f'</{p}parameter>\n<{p}parameter name="all" string="false">true</{p}parameter>\n'
        f"</{p}invoke>\n{closing}"
    )
    for pieces in chunkings(text, n=5):
        _, events = parse(pieces)
        assert merged(events)[-1] == ToolCallEnd(0, '{"dir":"/tmp","all":true}')


def test_loose_nested_parameters_become_an_object():
    text = (
        '<｜DSML｜tool_calls><｜DSML｜invoke name="edit">'
        '<｜DSML｜parameter name="path" string="true">a.txt</｜DSML｜parameter>'
        '<｜DSML｜parameter name="edits">\n'
        '<｜DSML｜parameter name="oldText" string="true">old <text></｜DSML｜parameter>'
        '<｜DSML｜parameter name="count" string="false">2</｜DSML｜parameter>\n'
        "</｜DSML｜parameter></｜DSML｜invoke></｜DSML｜tool_calls>"
    )
    expected = '{"path":"a.txt","edits":{"oldText":"old <text>","count":2}}'
    for pieces in chunkings(text, n=10):
        events = merged(parse(pieces)[1])
        assert events[-1] == ToolCallEnd(0, expected)
        assert json.loads(events[-2].text) == json.loads(expected)


def test_untyped_value_is_a_string_and_empty_json_is_null():
    text = (
        '<｜DSML｜tool_calls><｜DSML｜invoke name="f">'
        '<｜DSML｜parameter name="a">plain</｜DSML｜parameter>'
        '<｜DSML｜parameter name="b" string="false"> </｜DSML｜parameter>'
        '<｜DSML｜parameter name="c" string="false">[1, 2,\n 3]</｜DSML｜parameter>'
        "</｜DSML｜invoke></｜DSML｜tool_calls>"
    )
    events = merged(parse(list(text))[1])
    assert events[-1] == ToolCallEnd(0, '{"a":"plain","b":null,"c":[1,2,3]}')


def test_malformed_block_comes_back_as_text():
    bad = "Sure.\n\n<｜DSML｜tool_calls>\n<｜DSML｜bogus>oops"
    for pieces in chunkings(bad, n=5):
        parser, events = parse(pieces)
        assert merged(events) == [TextDelta(bad)]
        assert parser.malformed and not parser.tool_calls
    # A call already announced is closed (every start gets an end), the rest is text.
    cut = TEXT[: TEXT.index("<｜DSML｜invoke", TEXT.index("</｜DSML｜invoke>"))] + "<junk/>"
    parser, events = parse([cut])
    ends = [e for e in events if isinstance(e, ToolCallEnd)]
    assert len(ends) == 1 and merged(events)[-1] == TextDelta("<junk/>") and parser.malformed
    # Generation stopped inside the block: the open call is closed too.
    parser, events = parse([TEXT[: TEXT.index("timeout")]])
    assert parser.malformed and len([e for e in events if isinstance(e, ToolCallEnd)]) == 1


def test_thinking_split_and_dsml_inside_reasoning_is_not_a_call():
    block = render_tool_calls([ToolCall("a", "bash", '{"command": "pwd"}')])
    text = "Thinking about " + block + " no.</think>\nAnswer first." + block
    want = None
    for pieces in chunkings(text, n=10):
        parser = output_parser(tools=True, stops=None, thinking=True)
        events = []
        for piece in pieces:
            events += parser.feed(piece)
        events += parser.flush()
        got = merged(events)
        if want is None:
            want = got
        assert got == want
    assert want[0] == ReasoningDelta("Thinking about " + block + " no.")
    assert want[1] == TextDelta("\nAnswer first.")  # the answer is kept byte for byte
    assert want[-1] == ToolCallEnd(0, '{"command":"pwd"}') and len(want) == 5


def test_think_splitter_edges():
    s = ThinkSplitter(in_reasoning=False)
    assert s.feed("<thi") == [] and s.feed("nk>abc</th") == [("reasoning", "abc")]
    assert s.feed("ink>done") == [("text", "done")] and s.closed
    s = ThinkSplitter(in_reasoning=True)
    assert s.feed("still thinking") == [("reasoning", "still thinking")]
    assert s.flush() == [] and not s.closed
    s = ThinkSplitter(in_reasoning=False)
    assert s.feed("<b>x</think>") == [("text", "<b>x</think>")]


# ---- forced greedy: the DSML decode tracker ---------------------------------------


def reference_state(text: str) -> DSMLState:
    """The state after `text`, by a fresh tracker reading it in one piece."""
    tracker = DSMLTracker()
    return tracker.feed(text)


def test_tracker_states():
    S = DSMLState
    head = 'pre <｜DSML｜tool_calls>\n<｜DSML｜invoke name="bash">\n'
    cases = [
        ("plain text <｜DSML｜tool_", S.OUTSIDE),
        (head, S.STRUCTURAL),
        (head + '<｜DSML｜parameter name="cmd" string="tr', S.STRUCTURAL),
        (head + '<｜DSML｜parameter name="cmd" string="true">ls -la', S.STRING_BODY),
        (head + '<｜DSML｜parameter name="cmd" string="true">ls <', S.STRING_BODY),
        (head + '<｜DSML｜parameter name="cmd" string="true">ls </', S.STRUCTURAL),
        (head + '<｜DSML｜parameter name="n" string="false">{"a": [1', S.JSON_STRUCTURAL),
        (head + '<｜DSML｜parameter name="n" string="false">{"a": "x</｜DS', S.JSON_STRING),
        (head + '<｜DSML｜parameter name="n" string="false">{"a": 1}</｜DS', S.STRUCTURAL),
        (head + '<｜DSML｜parameter name="n">42', S.JSON_STRUCTURAL),
        (head + "</｜DSML｜invoke>\n</｜DSML｜tool_calls>", S.OUTSIDE),
        (head + "</｜DSML｜invoke>\n</｜DSML｜tool_calls> <｜DSML｜tool_calls>", S.OUTSIDE),
        ("<think>x <DSML｜tool_calls>", S.STRUCTURAL),  # not gated by thinking
    ]
    for text, state in cases:
        assert reference_state(text) is state, text
    assert DSMLTracker().feed(head).value == "structural"


def test_tracker_is_incremental():
    tracker = DSMLTracker()
    greedy = []
    for i, c in enumerate(TEXT):
        state = tracker.feed(c)
        assert state is reference_state(TEXT[: i + 1]), (i, TEXT[: i + 1][-30:])
        greedy.append(tracker.greedy)
    # Payload bytes are sampled normally, markup greedily, and the block ends outside.
    assert tracker.state is DSMLState.OUTSIDE and not tracker.greedy
    start = TEXT.index("<｜DSML｜tool_calls>") + len("<｜DSML｜tool_calls>")
    assert not any(greedy[: start - 1]) and greedy[start - 1]
    body = TEXT.index("grep -n")
    assert not greedy[body] and not greedy[body + 10]


def test_ds4_decode_policy():
    from ds4d.chat.deepseek4 import ThinkMode
    from ds4d.chat.deepseek4_output import DS4Decode
    from ds4d.chat.types import ChatRequest, Message, Tool
    from ds4d.engine.sampler import SamplingParams

    base = SamplingParams(temperature=0.3, top_k=40, top_p=0.9, min_p=0.0)
    req = ChatRequest(messages=[Message("user", "hi")], tools=[Tool("bash")])
    block = render_tool_calls([ToolCall("a", "bash", '{"command": "pwd"}')])
    decode = DS4Decode(req, ThinkMode.HIGH)
    seen = []
    for c in "hmm</think>Running." + block + "\ntrailing":
        params = decode.sampling(base)
        seen.append((params.temperature, params.top_k, params.min_p))
        decode.feed(c)
        if decode.tool_block_closed:
            break
    assert decode.tool_block_closed and decode.tool_calls == 1 and not decode.stopped
    assert seen[0] == (1.0, 0, 0.05)  # thinking ignores the client's knobs
    assert any(t == 0.0 for t, _, _ in seen)  # markup sampled greedily
    body = len("hmm</think>Running.") + block.index(">pwd<") + 1
    assert seen[body][0] == 1.0  # the payload keeps the sampling
    plain = DS4Decode(ChatRequest(messages=[Message("user", "hi")]), ThinkMode.NONE)
    plain.feed(block)
    assert plain.sampling(base) is base and not plain.tool_block_closed


def test_exact_replay_keeps_the_next_prompt_aligned_with_the_generated_text():
    from ds4d.chat.deepseek4_output import DS4ChatFormat
    from ds4d.chat.types import ChatRequest, Message, Tool
    from ds4d.state.toolmemory import ToolMemory

    memory = ToolMemory()
    fmt = DS4ChatFormat(n_ctx=65536, replay=memory)
    tools = [Tool("bash", "Run a command", {"type": "object"})]
    first = [Message("user", "list files")]
    prompt = fmt.render(ChatRequest(messages=first, tools=tools))
    # The model's own spelling: other key order and spacing than the canonical form.
    generated = (
        "I should run ls.</think>Listing."
        '\n\n<｜DSML｜tool_calls>\n<｜DSML｜invoke name="bash">\n'
        '<｜DSML｜parameter name="timeout" string="false">[ 5 ]</｜DSML｜parameter>\n'
        '<｜DSML｜parameter name="command" string="true">ls -la</｜DSML｜parameter>\n'
        "</｜DSML｜invoke>\n</｜DSML｜tool_calls>"
    )
    decode = fmt.decode(ChatRequest(messages=first, tools=tools))
    events = []
    for c in generated:
        events += decode.feed(c)
        assert not decode.tool_block_closed or c == ">"
    events += decode.flush()
    assert decode.tool_block_closed
    memory.update(decode.replay)
    (start,) = [e for e in events if isinstance(e, ToolCallStart)]
    (end,) = [e for e in events if isinstance(e, ToolCallEnd)]
    content = "".join(e.text for e in events if isinstance(e, TextDelta))
    reasoning = "".join(e.text for e in events if isinstance(e, ReasoningDelta))
    assert (content, reasoning) == ("Listing.", "I should run ls.")
    # The client sends the turn back re-serialized; the render reproduces the KV exactly.
    turn = Message(
        "assistant",
        content,
        reasoning=reasoning,
        tool_calls=[ToolCall(start.id, start.name, end.arguments)],
    )
    second = ChatRequest(messages=[*first, turn, Message("tool", "a b c")], tools=tools)
    assert fmt.render(second).startswith(prompt + generated + "<｜end▁of▁sentence｜>")
    # Without the memory the canonical form is rendered instead.
    canonical = DS4ChatFormat(n_ctx=65536).render(second)
    assert not canonical.startswith(prompt + generated)
    assert render_tool_calls(turn.tool_calls) in canonical


def test_completions_render_and_keep_raw_text():
    from ds4d.chat.deepseek4_output import DS4ChatFormat
    from ds4d.chat.types import ChatRequest

    fmt = DS4ChatFormat(n_ctx=4096)
    req = ChatRequest(messages=[], raw_prompt="2+2=", stop=["\n\n"])
    assert fmt.render(req).endswith("<｜User｜>2+2=<｜Assistant｜><think>")
    decode = fmt.decode(req)
    events = decode.feed("so 4</think>4") + decode.feed("\n\nmore") + decode.flush()
    assert merged(events) == [TextDelta("so 4</think>4")] and decode.parser.stopped


def test_history_with_tools_parses_calls_even_with_tool_choice_none():
    from ds4d.chat.deepseek4 import ThinkMode
    from ds4d.chat.deepseek4_output import DS4Decode
    from ds4d.chat.types import ChatRequest, Message, Tool, ToolChoice

    call = ToolCall("c1", "bash", '{"command": "pwd"}')
    history = [
        Message("user", "go"),
        Message("assistant", "", tool_calls=[call]),
        Message("tool", "/tmp"),
    ]
    req = ChatRequest(messages=history, tools=[Tool("bash")], tool_choice=ToolChoice("none"))
    decode = DS4Decode(req, ThinkMode.NONE)
    events = decode.feed("Again." + render_tool_calls([call])) + decode.flush()
    assert decode.parser.tool_calls == 1 and isinstance(events[-1], ToolCallEnd)
    assert not decode.tool_block_closed and decode.tracker is None  # no stop, no greedy
    fresh = DS4Decode(ChatRequest(messages=history[:1]), ThinkMode.NONE)
    text = "Again." + render_tool_calls([call])
    assert merged(fresh.feed(text) + fresh.flush()) == [TextDelta(text)]
