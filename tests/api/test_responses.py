"""OpenAI Responses translation: input items, tools (namespaces, hosted tools skipped),
stateless checks, and the lifecycle event sequence with sequence numbers."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from ds4d.api import openai_responses as rs
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


def test_input_items_and_tools():
    req = rs.parse(
        {
            "model": "gpt-5",
            "instructions": "be kind",
            "max_output_tokens": 50,
            "reasoning": {"effort": "low", "summary": "auto"},
            "store": False,
            "include": ["reasoning.encrypted_content"],
            "prompt_cache_key": "k",
            "tools": [
                {"type": "function", "name": "exec", "parameters": {"type": "object"}},
                {
                    "type": "namespace",
                    "name": "ns",
                    "tools": [{"type": "function", "name": "inner", "description": "d"}],
                },
                {"type": "web_search", "external_web_access": False},
            ],
            "input": [
                {
                    "type": "message",
                    "role": "developer",
                    "content": [{"type": "input_text", "text": "dev"}],
                },
                {
                    "role": "user",
                    "content": [
                        {"type": "input_text", "text": "go"},
                        {"type": "input_image", "image_url": "x"},
                    ],
                },
                {"type": "reasoning", "summary": [{"type": "summary_text", "text": "plan"}]},
                {
                    "type": "function_call",
                    "call_id": "call_1",
                    "name": "exec",
                    "arguments": '{"cmd":"ls"}',
                },
                {"type": "function_call_output", "call_id": "call_1", "output": "a b"},
                {"type": "item_reference", "id": "x"},
            ],
        },
        D,
    )
    assert [m.role for m in req.messages] == ["system", "system", "user", "assistant", "tool"]
    assert req.messages[0].content == "be kind" and req.messages[2].content == "go"
    asst = req.messages[3]
    assert asst.reasoning == "plan" and asst.tool_calls[0].id == "call_1"
    assert req.messages[4].content == "a b" and req.messages[4].tool_call_id == "call_1"
    assert [t.name for t in req.tools] == ["exec", "inner"]
    assert req.max_tokens == 50 and req.thinking is True


@pytest.mark.parametrize(
    "body,needle",
    [
        ({}, "input"),
        ({"input": 5}, "input"),
        ({"input": []}, "at least one message"),
        ({"input": "x", "previous_response_id": "resp_1"}, "previous_response_id"),
        ({"input": [{"role": "critic", "content": "x"}]}, "role"),
        ({"input": "x", "max_output_tokens": -1}, "max_output_tokens"),
        ({"input": "x", "reasoning": {"effort": "galactic"}}, "reasoning.effort"),
        ({"input": "x", "tool_choice": "required"}, "tool"),
        (
            {
                "input": [
                    {"role": "user", "content": "x"},
                    {"type": "function_call_output", "call_id": {"a": 1}, "output": "o"},
                ]
            },
            "call_id",
        ),
        (
            {
                "input": [
                    {"role": "user", "content": "x"},
                    {"type": "function_call_output", "output": "o"},
                ]
            },
            "call_id",
        ),
    ],
)
def test_bad_requests(body, needle):
    with pytest.raises(ApiError) as e:
        rs.parse(body, D)
    assert needle in e.value.message and e.value.status == 400
    assert rs.error_body(e.value)["error"]["type"] == "invalid_request_error"


EVENTS = [
    Usage(20, 0, 12, "memory-text"),
    ReasoningDelta("r"),
    TextDelta("Hel"),
    TextDelta("lo"),
    ToolCallStart(0, "call_z", "exec"),
    ToolCallArgsDelta(0, "{}"),
    ToolCallEnd(0, "{}"),
    Usage(20, 4, 12, "memory-text"),
    Finish("tool_calls"),
]


def test_stream_lifecycle():
    req = rs.parse({"input": "x", "stream": True}, D)
    s = rs.Stream(req, "m")
    frames = s.open()
    for ev in EVENTS:
        frames += s.feed(ev)
    evs = [json.loads(f.split("data: ", 1)[1]) for f in frames]
    assert [e["sequence_number"] for e in evs] == list(range(len(evs)))
    types = [e["type"] for e in evs]
    assert types == [
        "response.created",
        "response.in_progress",
        "response.output_item.added",
        "response.reasoning_summary_part.added",
        "response.reasoning_summary_text.delta",
        "response.reasoning_summary_text.done",
        "response.reasoning_summary_part.done",
        "response.output_item.done",
        "response.output_item.added",
        "response.content_part.added",
        "response.output_text.delta",
        "response.output_text.delta",
        "response.output_text.done",
        "response.content_part.done",
        "response.output_item.done",
        "response.output_item.added",
        "response.function_call_arguments.delta",
        "response.function_call_arguments.done",
        "response.output_item.done",
        "response.completed",
    ]
    final = evs[-1]["response"]
    assert [o["type"] for o in final["output"]] == ["reasoning", "message", "function_call"]
    assert final["output"][1]["content"][0]["text"] == "Hello"
    assert final["output"][2]["call_id"] == "call_z"
    assert final["usage"]["input_tokens_details"] == {"cached_tokens": 12}
    assert [e.get("output_index") for e in evs if e["type"] == "response.output_item.added"] == [
        0,
        1,
        2,
    ]


def test_incomplete_and_failed():
    c = Completion()
    for ev in (TextDelta("x"), Usage(3, 3), Finish("length")):
        c.add(ev)
    req = rs.parse({"input": "x", "max_output_tokens": 3}, D)
    r = rs.response(req, c, "m")
    assert r["status"] == "incomplete"
    assert r["incomplete_details"] == {"reason": "max_output_tokens"}
    s = rs.Stream(req, "m")
    frames = s.open() + s.feed(Finish("error", "boom"))
    last = json.loads(frames[-1].split("data: ", 1)[1])
    assert last["type"] == "response.failed" and last["response"]["error"]["message"] == "boom"


def _codex_body() -> dict:
    path = (
        Path(__file__).parents[1]
        / "data"
        / "fixtures"
        / "clients"
        / "codex-cli-0.171.0-first-request.json"
    )
    return json.loads(path.read_text())["body"]


def test_codex_namespaced_tool_call_carries_its_namespace_both_ways():
    body = _codex_body()
    req = rs.parse(body, D)
    assert "resume_agent" in [t.name for t in req.tools]
    events = [
        Usage(9, 0),
        ToolCallStart(0, "call_r", "resume_agent"),
        ToolCallArgsDelta(0, '{"id":"a"}'),
        ToolCallEnd(0, '{"id":"a"}'),
        ToolCallStart(1, "call_e", "exec_command"),
        ToolCallEnd(1, '{"cmd":"ls"}'),
        Usage(9, 4),
        Finish("tool_calls"),
    ]
    s = rs.Stream(req, "m")
    frames = s.open()
    for ev in events:
        frames += s.feed(ev)
    evs = [json.loads(f.split("data: ", 1)[1]) for f in frames]
    added = [e["item"] for e in evs if e["type"] == "response.output_item.added"]
    done = [e["item"] for e in evs if e["type"] == "response.output_item.done"]
    for items in (added, done, evs[-1]["response"]["output"]):
        assert items[0]["name"] == "resume_agent" and items[0]["namespace"] == "multi_agent_v1"
        assert "namespace" not in items[1]  # a top-level function has none
    c = Completion()
    for ev in events:
        c.add(ev)
    plain = rs.response(req, c, "m")["output"]
    assert plain[0]["namespace"] == "multi_agent_v1" and "namespace" not in plain[1]
    # The client sends the item back, namespace and all, with its output.
    body["input"] = [
        *body["input"],
        done[0],
        {"type": "function_call_output", "call_id": "call_r", "output": "ok"},
    ]
    again = rs.parse(body, D)
    call = again.messages[-2].tool_calls[0]
    assert (call.id, call.name, call.arguments) == ("call_r", "resume_agent", '{"id":"a"}')
    assert again.messages[-1].role == "tool" and again.messages[-1].tool_call_id == "call_r"


def test_created_echoes_the_requests_tools_and_tool_choice():
    body = _codex_body()
    body["tool_choice"] = {"type": "function", "name": "exec_command"}
    req = rs.parse(body, D)
    created = json.loads(rs.Stream(req, "m").open()[0].split("data: ", 1)[1])["response"]
    assert created["tool_choice"] == body["tool_choice"]
    assert created["tools"] == body["tools"]
    plain = rs.parse({"input": "x"}, D)
    first = json.loads(rs.Stream(plain, "m").open()[0].split("data: ", 1)[1])["response"]
    assert first["tool_choice"] == "auto" and first["tools"] == []


def test_a_message_cut_by_the_token_limit_is_incomplete():
    req = rs.parse({"input": "x", "max_output_tokens": 2}, D)
    s = rs.Stream(req, "m")
    frames = s.open()
    for ev in (Usage(3, 0), TextDelta("Hel"), TextDelta("lo"), Usage(3, 2), Finish("length")):
        frames += s.feed(ev)
    evs = [json.loads(f.split("data: ", 1)[1]) for f in frames]
    done = [e["item"] for e in evs if e["type"] == "response.output_item.done"]
    assert done[0]["status"] == "incomplete"
    assert evs[-1]["type"] == "response.incomplete"
    assert evs[-1]["response"]["output"][0]["status"] == "incomplete"
    c = Completion()
    for ev in (TextDelta("Hello"), Usage(3, 2), Finish("length")):
        c.add(ev)
    assert rs.response(req, c, "m")["output"][0]["status"] == "incomplete"
    c.finish = Finish("stop")
    assert rs.response(req, c, "m")["output"][0]["status"] == "completed"


def test_keepalive_is_an_event_of_the_same_response():
    """While the prompt is prefilled the stream's keepalive is `response.in_progress`
    again: an SSE comment is no event to Codex's reader (it drops a stream after
    `stream_idle_timeout_ms` without one)."""
    req = rs.parse({"input": "x", "stream": True}, D)
    s = rs.Stream(req, "m")
    frames = s.open() + [s.keepalive(), s.keepalive()]
    assert all(f.startswith("event: response.") for f in frames)
    evs = [json.loads(f.split("data: ", 1)[1]) for f in frames]
    assert [e["type"] for e in evs] == ["response.created"] + ["response.in_progress"] * 3
    assert [e["sequence_number"] for e in evs] == [0, 1, 2, 3]
    assert {e["response"]["id"] for e in evs} == {s.b.id}
    assert all(e["response"]["status"] == "in_progress" for e in evs)
    frames = s.feed(TextDelta("hi")) + s.feed(Usage(3, 1)) + s.feed(Finish("stop"))
    after = [json.loads(f.split("data: ", 1)[1])["sequence_number"] for f in frames]
    assert after == list(range(len(evs), len(evs) + len(frames)))


def test_a_cap_the_client_never_set_completes_the_response():
    """Codex sends no max_output_tokens and fails (then retries) a turn that ends in
    `response.incomplete`: an answer cut by ds4d's default cap completes, its message
    item marked `incomplete`."""
    req = rs.parse({"input": "x", "stream": True}, D)
    req.max_tokens = 64  # what the server applies to a request without a limit
    s = rs.Stream(req, "m")
    frames = s.open()
    for ev in (TextDelta("Hel"), Usage(3, 64), Finish("length")):
        frames += s.feed(ev)
    evs = [json.loads(f.split("data: ", 1)[1]) for f in frames]
    assert evs[-1]["type"] == "response.completed"
    final = evs[-1]["response"]
    assert final["status"] == "completed" and final["incomplete_details"] is None
    assert final["output"][0]["status"] == "incomplete"
    c = Completion()
    for ev in (TextDelta("Hello"), Usage(3, 64), Finish("length")):
        c.add(ev)
    r = rs.response(req, c, "m")
    assert r["status"] == "completed" and r["output"][0]["status"] == "incomplete"
