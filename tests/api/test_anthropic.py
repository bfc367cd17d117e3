"""Anthropic Messages translation: parsing (system blocks, tool_use / tool_result,
thinking controls), error shape, and the streaming event sequence."""

from __future__ import annotations

import json

import pytest

from ds4d.api import anthropic_messages as am
from ds4d.api.common import ApiError, Completion
from ds4d.chat.types import (
    Finish,
    ReasoningDelta,
    Sampling,
    TextDelta,
    ToolCallArgsDelta,
    ToolCallEnd,
    ToolCallStart,
    Usage,
)

D = Sampling()
TOOL = {
    "name": "Bash",
    "description": "run",
    "input_schema": {
        "type": "object",
        "properties": {"command": {"type": "string"}},
        "required": ["command"],
    },
}


def test_parse_blocks_and_tools():
    req = am.parse(
        {
            "model": "claude",
            "max_tokens": 100,
            "stop_sequences": ["###"],
            "system": [{"type": "text", "text": "You are a"}, {"type": "text", "text": "bot."}],
            "tools": [TOOL, {"type": "web_search_20250305", "name": "web_search"}],
            "tool_choice": {"type": "tool", "name": "Bash"},
            "thinking": {"type": "adaptive"},
            "context_management": {"edits": []},
            "metadata": {"user_id": "u"},
            "messages": [
                {"role": "user", "content": "list files"},
                {
                    "role": "assistant",
                    "content": [
                        {"type": "thinking", "thinking": "use ls", "signature": "s"},
                        {"type": "text", "text": "Running."},
                        {
                            "type": "tool_use",
                            "id": "toolu_1",
                            "name": "Bash",
                            "input": {"command": "ls"},
                        },
                    ],
                },
                {
                    "role": "user",
                    "content": [
                        {
                            "type": "tool_result",
                            "tool_use_id": "toolu_1",
                            "content": [{"type": "text", "text": "a.txt"}],
                        },
                        {"type": "text", "text": "thanks"},
                    ],
                },
                {"role": "system", "content": "late system text"},
            ],
        },
        D,
    )
    roles = [m.role for m in req.messages]
    assert roles == ["system", "user", "assistant", "tool", "user", "system"]
    assert req.messages[0].content == "You are a\nbot."
    asst = req.messages[2]
    assert asst.reasoning == "use ls" and asst.content == "Running."
    assert asst.tool_calls[0].id == "toolu_1"
    assert json.loads(asst.tool_calls[0].arguments) == {"command": "ls"}
    assert req.messages[3].content == "a.txt" and req.messages[3].tool_call_id == "toolu_1"
    assert [t.name for t in req.tools] == ["Bash"]
    assert (req.tool_choice.mode, req.tool_choice.name) == ("named", "Bash")
    assert req.thinking is True and req.stop == ["###"] and req.tool_id_prefix == "toolu_"


@pytest.mark.parametrize(
    "body,needle",
    [
        ({"messages": [{"role": "user", "content": "x"}]}, "max_tokens"),
        ({"max_tokens": 5, "messages": []}, "empty"),
        ({"max_tokens": 5, "messages": [{"role": "tool", "content": "x"}]}, "role"),
        ({"max_tokens": 5, "messages": [{"role": "user", "content": 3}]}, "content"),
        (
            {"max_tokens": 5, "messages": [{"role": "user", "content": "x"}], "temperature": 1.5},
            "temperature",
        ),
        (
            {
                "max_tokens": 5,
                "messages": [{"role": "user", "content": "x"}],
                "thinking": {"type": "sometimes"},
            },
            "thinking",
        ),
        (
            {
                "max_tokens": 5,
                "messages": [{"role": "user", "content": "x"}],
                "tool_choice": {"type": "any"},
            },
            "tool",
        ),
    ],
)
def test_bad_requests_in_anthropic_shape(body, needle):
    with pytest.raises(ApiError) as e:
        am.parse(body, D)
    assert needle in e.value.message
    shape = am.error_body(e.value)
    assert shape["type"] == "error" and shape["error"]["type"] == "invalid_request_error"


def test_count_tokens_needs_no_max_tokens():
    req = am.parse({"messages": [{"role": "user", "content": "x"}]}, D, count_only=True)
    assert req.max_tokens is None


def test_error_types_by_status():
    assert am.error_body(ApiError(503, "busy"))["error"]["type"] == "overloaded_error"
    assert am.error_body(ApiError(413, "big"))["error"]["type"] == "request_too_large"


EVENTS = [
    Usage(100, 0, 90, "memory-token"),
    ReasoningDelta("think"),
    TextDelta("Hello"),
    ToolCallStart(0, "toolu_x", "Bash"),
    ToolCallArgsDelta(0, '{"command":"ls"}'),
    ToolCallEnd(0, '{"command":"ls"}'),
    Usage(100, 5, 90, "memory-token"),
    Finish("tool_calls"),
]


def _events(frames):
    out = []
    for f in frames:
        name, data = f.split("\n")[0], f.split("\n")[1]
        assert name.startswith("event: ") and data.startswith("data: ")
        body = json.loads(data[6:])
        assert body["type"] == name[7:]
        out.append(body)
    return out


def test_stream_sequence():
    req = am.parse({"max_tokens": 9, "messages": [{"role": "user", "content": "x"}]}, D)
    s = am.Stream(req, "c")
    frames = s.open()
    for ev in EVENTS:
        frames += s.feed(ev)
    evs = _events(frames)
    types = [e["type"] for e in evs]
    assert types == [
        "message_start",
        "ping",
        "content_block_start",
        "content_block_delta",
        "content_block_delta",
        "content_block_stop",
        "content_block_start",
        "content_block_delta",
        "content_block_stop",
        "content_block_start",
        "content_block_delta",
        "content_block_stop",
        "message_delta",
        "message_stop",
    ]
    assert evs[0]["message"]["usage"]["cache_read_input_tokens"] == 90
    assert evs[2]["content_block"]["type"] == "thinking"
    assert evs[4]["delta"]["type"] == "signature_delta"
    assert evs[9]["content_block"] == {
        "type": "tool_use",
        "id": "toolu_x",
        "name": "Bash",
        "input": {},
    }
    assert evs[10]["delta"] == {"type": "input_json_delta", "partial_json": '{"command":"ls"}'}
    assert [e["index"] for e in evs if "index" in e] == [0, 0, 0, 0, 1, 1, 1, 2, 2, 2]
    assert evs[-2]["delta"]["stop_reason"] == "tool_use"
    assert evs[-2]["usage"]["output_tokens"] == 5


def test_stream_starts_on_the_prompt_count_and_the_final_delta_carries_the_split():
    """The generation reports the prompt's size before prefilling (nothing reused known
    yet): message_start goes out on it; keepalives are then empty deltas of a thinking
    block, and the message_delta at the end has the reuse found by the prefill."""
    req = am.parse({"max_tokens": 9, "messages": [{"role": "user", "content": "x"}]}, D)
    s = am.Stream(req, "c")
    assert s.open() == [] and s.keepalive().startswith(":")  # no event before message_start
    evs = _events(s.feed(Usage(100, 0)))
    assert [e["type"] for e in evs] == ["message_start", "ping"]
    assert evs[0]["message"]["usage"] == {
        "input_tokens": 100,
        "output_tokens": 0,
        "cache_read_input_tokens": 0,
        "cache_creation_input_tokens": 0,
    }
    assert s.feed(Usage(100, 0, 90, "slot")) == []  # after the prefill: no second start
    frames = s.feed(TextDelta("hi")) + s.feed(Usage(100, 1, 90, "slot")) + s.feed(Finish("stop"))
    delta = [e for e in _events(frames) if e["type"] == "message_delta"][0]
    assert delta["usage"] == {
        "input_tokens": 10,
        "output_tokens": 1,
        "cache_read_input_tokens": 90,
        "cache_creation_input_tokens": 0,
    }


def test_stream_of_thinking_only_still_has_a_text_block():
    req = am.parse({"max_tokens": 9, "messages": [{"role": "user", "content": "x"}]}, D)
    s = am.Stream(req, "c")
    frames = s.feed(Usage(3, 0)) + s.feed(ReasoningDelta("hm")) + s.feed(Finish("length"))
    evs = _events(frames)
    starts = [e["content_block"]["type"] for e in evs if e["type"] == "content_block_start"]
    assert starts == ["thinking", "text"]
    assert evs[-2]["delta"]["stop_reason"] == "max_tokens"


def test_response_json_and_stop_sequence():
    c = Completion()
    for ev in EVENTS:
        c.add(ev)
    req = am.parse({"max_tokens": 9, "messages": [{"role": "user", "content": "x"}]}, D)
    r = am.response(req, c, "c")
    assert [b["type"] for b in r["content"]] == ["thinking", "text", "tool_use"]
    assert r["content"][2]["input"] == {"command": "ls"}
    assert r["stop_reason"] == "tool_use"
    # No cache_control in the request: what was not reused is plain input.
    assert r["usage"] == {
        "input_tokens": 10,
        "output_tokens": 5,
        "cache_read_input_tokens": 90,
        "cache_creation_input_tokens": 0,
    }
    c2 = Completion()
    c2.add(Finish("stop", stop_sequence="###"))
    r2 = am.response(req, c2, "c")
    assert (r2["stop_reason"], r2["stop_sequence"]) == ("stop_sequence", "###")
    assert r2["content"] == [{"type": "text", "text": ""}]


def test_cache_control_marks_the_prefix_counted_as_cache_creation():
    body = {
        "max_tokens": 9,
        "system": [{"type": "text", "text": "sys", "cache_control": {"type": "ephemeral"}}],
        "messages": [
            {"role": "user", "content": "a"},
            {"role": "assistant", "content": "b"},
            {
                "role": "user",
                "content": [{"type": "text", "text": "c", "cache_control": {"type": "ephemeral"}}],
            },
            {"role": "assistant", "content": "d"},
            {"role": "user", "content": "e"},
        ],
    }
    req = am.parse(body, D)
    assert [m.content for m in req.cache_prefix.messages] == ["sys", "a", "b", "c"]
    assert req.cache_prefix.cache_prefix is None
    body["messages"][2]["content"][0].pop("cache_control")
    assert [m.content for m in am.parse(body, D).cache_prefix.messages] == ["sys"]
    body["system"] = "sys"
    assert am.parse(body, D).cache_prefix is None
    req = am.parse(body, D)
    # Unmarked: every token not read from the cache is input.
    assert am.usage_json(Usage(100, 5, 30), req) == {
        "input_tokens": 70,
        "output_tokens": 5,
        "cache_read_input_tokens": 30,
        "cache_creation_input_tokens": 0,
    }
    # Marked 60 tokens: of those, 30 were read and 30 written; the 40 after are input.
    req.cache_prefix_tokens = 60
    assert am.usage_json(Usage(100, 5, 30), req) == {
        "input_tokens": 40,
        "output_tokens": 5,
        "cache_read_input_tokens": 30,
        "cache_creation_input_tokens": 30,
    }
    # All of the marked prefix reused: nothing written.
    assert am.usage_json(Usage(100, 5, 80), req)["cache_creation_input_tokens"] == 0


def test_keepalives_are_content_events_claude_code_counts():
    """Claude Code drops a stream after 300 s without a content event (its SDK skips
    `ping`): while the prompt is prefilled the keepalive is an empty thinking delta, in
    a thinking block opened for it, which the reply's text then follows."""
    req = am.parse({"max_tokens": 9, "messages": [{"role": "user", "content": "x"}]}, D)
    s = am.Stream(req, "c")
    s.feed(Usage(100, 0))

    def keepalive(stream: am.Stream) -> list[dict]:  # one chunk of SSE frames
        return _events([f + "\n\n" for f in stream.keepalive().split("\n\n") if f])

    first, second = keepalive(s), keepalive(s)
    assert first == [
        {
            "type": "content_block_start",
            "index": 0,
            "content_block": {"type": "thinking", "thinking": "", "signature": ""},
        },
        {
            "type": "content_block_delta",
            "index": 0,
            "delta": {"type": "thinking_delta", "thinking": ""},
        },
    ]
    assert second == first[1:]
    evs = _events(s.feed(ReasoningDelta("hm")) + s.feed(TextDelta("hi")) + s.feed(Finish("stop")))
    assert [(e["type"], e.get("index")) for e in evs] == [
        ("content_block_delta", 0),
        ("content_block_delta", 0),
        ("content_block_stop", 0),
        ("content_block_start", 1),
        ("content_block_delta", 1),
        ("content_block_stop", 1),
        ("message_delta", None),
        ("message_stop", None),
    ]
    assert evs[0]["delta"] == {"type": "thinking_delta", "thinking": "hm"}
    # A slow token in an open text block: an empty text delta keeps the stream alive.
    t = am.Stream(req, "c")
    t.feed(Usage(100, 0))
    t.feed(TextDelta("a"))
    assert keepalive(t) == [
        {"type": "content_block_delta", "index": 0, "delta": {"type": "text_delta", "text": ""}}
    ]
    # The empty thinking block comes back in the next request's history: nothing renders.
    back = am.parse(
        {
            "max_tokens": 9,
            "messages": [
                {"role": "user", "content": "x"},
                {
                    "role": "assistant",
                    "content": [
                        {"type": "thinking", "thinking": "", "signature": "s"},
                        {"type": "text", "text": "hi"},
                    ],
                },
                {"role": "user", "content": "y"},
            ],
        },
        D,
    )
    assert back.messages[1].reasoning is None and back.messages[1].content == "hi"
