"""OpenAI chat / completions translation: request JSON -> neutral request (with 4xx
validation), neutral events -> the JSON and SSE chunks the SDK reads."""

from __future__ import annotations

import json

import pytest

from ds4d.api import openai_chat, openai_completions
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
    "type": "function",
    "function": {"name": "ls", "description": "list", "parameters": {"type": "object"}},
}


def test_messages_roles_parts_and_tool_history():
    req = openai_chat.parse(
        {
            "model": "gpt-x",
            "max_completion_tokens": 9,
            "stop": "END",
            "seed": 3,
            "temperature": 0.2,
            "top_k": 5,
            "unknown_field": {"ignored": True},
            "stream": True,
            "stream_options": {"include_usage": True},
            "tools": [TOOL, {"type": "web_search"}],
            "tool_choice": "auto",
            "messages": [
                {"role": "developer", "content": "rules"},
                {
                    "role": "user",
                    "content": [
                        {"type": "text", "text": "a"},
                        {"type": "image_url", "image_url": {"url": "x"}},
                        {"type": "text", "text": "b"},
                    ],
                },
                {
                    "role": "assistant",
                    "content": None,
                    "tool_calls": [
                        {
                            "id": "call_1",
                            "type": "function",
                            "function": {"name": "ls", "arguments": '{"path": "/"}'},
                        }
                    ],
                },
                {"role": "tool", "tool_call_id": "call_1", "content": "etc"},
            ],
        },
        D,
    )
    assert [m.role for m in req.messages] == ["system", "user", "assistant", "tool"]
    assert req.messages[1].content == "ab"
    assert req.messages[2].tool_calls[0].arguments == '{"path": "/"}'
    assert req.messages[3].tool_call_id == "call_1"
    assert [t.name for t in req.tools] == ["ls"]  # non-function tools skipped
    assert req.max_tokens == 9 and req.stop == ["END"] and req.sampling.seed == 3
    assert req.sampling.temperature == 0.2 and req.sampling.top_k == 5
    assert req.stream and req.include_usage and req.model == "gpt-x"


@pytest.mark.parametrize(
    "choice,mode,name",
    [
        ("auto", "auto", None),
        ("none", "none", None),
        ("required", "required", None),
        ({"type": "function", "function": {"name": "ls"}}, "named", "ls"),
    ],
)
def test_tool_choice(choice, mode, name):
    req = openai_chat.parse(
        {"messages": [{"role": "user", "content": "x"}], "tools": [TOOL], "tool_choice": choice}, D
    )
    assert (req.tool_choice.mode, req.tool_choice.name) == (mode, name)


@pytest.mark.parametrize(
    "body,needle",
    [
        ([], "JSON object"),
        ({}, "messages"),
        ({"messages": []}, "empty"),
        ({"messages": "hi"}, "array"),
        ({"messages": [{"role": "wizard", "content": "x"}]}, "role"),
        ({"messages": [{"role": "user", "content": 5}]}, "content"),
        ({"messages": [{"role": "user", "content": "x"}], "temperature": "hot"}, "temperature"),
        ({"messages": [{"role": "user", "content": "x"}], "temperature": 9}, "temperature"),
        ({"messages": [{"role": "user", "content": "x"}], "max_tokens": 0}, "max_tokens"),
        ({"messages": [{"role": "user", "content": "x"}], "max_tokens": True}, "max_tokens"),
        ({"messages": [{"role": "user", "content": "x"}], "stop": [1]}, "stop"),
        ({"messages": [{"role": "user", "content": "x"}], "n": 2}, "n=1"),
        ({"messages": [{"role": "user", "content": "x"}], "tool_choice": "required"}, "tool"),
        (
            {
                "messages": [{"role": "user", "content": "x"}],
                "tools": [TOOL],
                "tool_choice": {"type": "function", "function": {"name": "rm"}},
            },
            "rm",
        ),
        (
            {"messages": [{"role": "user", "content": "x"}], "reasoning_effort": "extreme"},
            "reasoning_effort",
        ),
    ],
)
def test_bad_requests(body, needle):
    with pytest.raises(ApiError) as e:
        openai_chat.parse(body, D)
    assert e.value.status == 400 and needle in e.value.message
    shape = openai_chat.error_body(e.value)
    assert shape["error"]["type"] == "invalid_request_error" and shape["error"]["message"]


def _events():
    return [
        Usage(50, 0, 40, "memory-token"),
        ReasoningDelta("hmm"),
        TextDelta("Hi"),
        ToolCallStart(0, "call_abc", "ls"),
        ToolCallArgsDelta(0, '{"path":"/"}'),
        ToolCallEnd(0, '{"path":"/"}'),
        Usage(50, 7, 40, "memory-token"),
        Finish("tool_calls"),
    ]


def test_chat_response_json():
    c = Completion()
    for ev in _events():
        c.add(ev)
    req = openai_chat.parse({"messages": [{"role": "user", "content": "x"}]}, D)
    r = openai_chat.response(req, c, "m")
    msg = r["choices"][0]["message"]
    assert msg["content"] == "Hi" and msg["reasoning_content"] == "hmm"
    assert msg["tool_calls"] == [
        {
            "id": "call_abc",
            "type": "function",
            "function": {"name": "ls", "arguments": '{"path":"/"}'},
        }
    ]
    assert r["choices"][0]["finish_reason"] == "tool_calls"
    assert r["usage"] == {
        "prompt_tokens": 50,
        "completion_tokens": 7,
        "total_tokens": 57,
        "prompt_tokens_details": {"cached_tokens": 40},
    }


def _data(frames):
    out = []
    for f in frames:
        assert f.endswith("\n\n")
        line = [x for x in f.splitlines() if x.startswith("data: ")][0][6:]
        out.append(line if line == "[DONE]" else json.loads(line))
    return out


def test_chat_stream_sequence():
    req = openai_chat.parse(
        {
            "messages": [{"role": "user", "content": "x"}],
            "stream": True,
            "stream_options": {"include_usage": True},
        },
        D,
    )
    s = openai_chat.Stream(req, "m")
    frames = s.open()
    for ev in _events():
        frames += s.feed(ev)
    chunks = _data(frames)
    deltas = [c["choices"][0]["delta"] for c in chunks[:-2]]
    assert deltas[0]["role"] == "assistant"
    assert deltas[1] == {"reasoning_content": "hmm"} and deltas[2] == {"content": "Hi"}
    assert deltas[3]["tool_calls"][0] == {
        "index": 0,
        "id": "call_abc",
        "type": "function",
        "function": {"name": "ls", "arguments": ""},
    }
    assert deltas[4]["tool_calls"][0] == {"index": 0, "function": {"arguments": '{"path":"/"}'}}
    assert chunks[-3]["choices"][0]["finish_reason"] == "tool_calls"
    assert chunks[-2]["choices"] == [] and chunks[-2]["usage"]["prompt_tokens_details"] == {
        "cached_tokens": 40
    }
    assert chunks[-1] == "[DONE]"
    assert len({c["id"] for c in chunks[:-1]}) == 1


def test_chat_stream_without_usage_request_has_no_usage_chunk():
    req = openai_chat.parse({"messages": [{"role": "user", "content": "x"}]}, D)
    s = openai_chat.Stream(req, "m")
    frames = s.open() + s.feed(Usage(1, 1)) + s.feed(Finish("stop"))
    assert not any("usage" in c for c in _data(frames) if c != "[DONE]")


def test_completions_parse_and_shapes():
    req = openai_completions.parse({"prompt": ["Once"], "max_tokens": 4, "stop": ["\n"]}, D)
    assert req.raw_prompt == "Once" and req.max_tokens == 4 and req.stop == ["\n"]
    assert openai_completions.parse({"prompt": "x"}, D).max_tokens == 16
    for bad in ({}, {"prompt": 5}, {"prompt": [1, 2]}, {"prompt": "x", "echo": True}):
        with pytest.raises(ApiError):
            openai_completions.parse(bad, D)
    c = Completion()
    for ev in (TextDelta(" upon"), Usage(2, 1, 0), Finish("length")):
        c.add(ev)
    r = openai_completions.response(req, c, "m")
    assert r["object"] == "text_completion" and r["choices"][0]["text"] == " upon"
    assert r["choices"][0]["finish_reason"] == "length"
    s = openai_completions.Stream(req, "m")
    chunks = _data(s.open() + s.feed(TextDelta("a")) + s.feed(Finish("stop")))
    assert chunks[0]["choices"][0]["text"] == "a" and chunks[-1] == "[DONE]"


def test_speculative_opt_out_is_a_boolean():
    body = {"messages": [{"role": "user", "content": "x"}]}
    assert openai_chat.parse(body, Sampling()).sampling.speculative is True
    off = openai_chat.parse({**body, "speculative": False}, Sampling())
    assert off.sampling.speculative is False
    with pytest.raises(ApiError) as e:
        openai_chat.parse({**body, "speculative": "no"}, Sampling())
    assert e.value.status == 400 and "speculative" in e.value.message
