"""ds4d.api.ollama: Ollama request JSON to the neutral request, events to NDJSON lines."""

from __future__ import annotations

import json
from datetime import datetime, timezone
from typing import Any

import pytest

from ds4d.api import ollama
from ds4d.api.common import ApiError, Completion
from ds4d.chat.types import (
    Finish,
    ReasoningDelta,
    Sampling,
    TextDelta,
    ToolCall,
    ToolCallArgsDelta,
    ToolCallEnd,
    ToolCallStart,
    Usage,
)

NOW = datetime(2025, 1, 2, 3, 4, 5, 678901, tzinfo=timezone.utc)
DEFAULTS = Sampling(temperature=0.7, top_p=1.0, top_k=0, min_p=0.05)


def chat(**body: Any) -> ollama.OllamaRequest:
    return ollama.parse_chat({"model": "m", **body}, DEFAULTS)


def test_chat_request_maps_options_think_tools_and_streams_by_default() -> None:
    p = chat(
        messages=[{"role": "user", "content": "hi"}],
        options={"num_predict": 12, "temperature": 0.2, "top_k": 5, "top_p": 0.9,
                 "min_p": 0.1, "seed": 3, "stop": ["END"], "num_ctx": 2048,
                 "num_thread": 4, "use_mmap": True, "repeat_penalty": 1.0},
        think="high",
        keep_alive="1h30m",
        tools=[{"type": "function", "function": {"name": "ls", "parameters": {
            "type": "object", "properties": {}}}}],
    )  # fmt: skip
    r = p.request
    assert r.stream is True and r.max_tokens == 12 and r.stop == ["END"]
    assert (r.sampling.temperature, r.sampling.top_k, r.sampling.top_p) == (0.2, 5, 0.9)
    assert (r.sampling.min_p, r.sampling.seed) == (0.1, 3)
    assert r.thinking is True and r.reasoning_effort == "high"
    assert [t.name for t in r.tools] == ["ls"]
    assert p.num_ctx == 2048 and p.keep_alive_s == 5400 and not p.load_only


@pytest.mark.parametrize(
    ("value", "seconds"),
    [(None, None), (0, 0.0), (-1, -1.0), ("5m", 300.0), ("-1s", -1.0), ("90", 90.0),
     ("1h30m", 5400.0), (2.5, 2.5), ("250ms", 0.25)],
)  # fmt: skip
def test_keep_alive_numbers_and_durations(value: Any, seconds: float | None) -> None:
    assert ollama.keep_alive_seconds(value) == seconds


@pytest.mark.parametrize("value", ["soon", "5 m", True, [], "m5", float("inf")])
def test_bad_keep_alive_is_a_400(value: Any) -> None:
    with pytest.raises(ApiError) as e:
        ollama.keep_alive_seconds(value)
    assert e.value.status == 400 and "keep_alive" in e.value.message


@pytest.mark.parametrize(
    ("options", "word"),
    [({"repeat_penalty": 1.2}, "repeat_penalty"), ({"mirostat": 2}, "mirostat"),
     ({"frequency_penalty": 0.5}, "frequency_penalty"), ({"warp": 1}, "warp"),
     ({"num_predict": 0}, "num_predict"), ({"num_ctx": 0}, "num_ctx"),
     ({"temperature": "hot"}, "temperature")],
)  # fmt: skip
def test_options_ds4d_cannot_honour_are_refused_by_name(options: dict, word: str) -> None:
    with pytest.raises(ApiError) as e:
        chat(messages=[{"role": "user", "content": "x"}], options=options)
    assert e.value.status == 400 and word in e.value.message


def test_neutral_values_of_unsupported_options_and_runner_options_pass() -> None:
    p = chat(
        messages=[{"role": "user", "content": "x"}],
        options={"repeat_penalty": 1.0, "mirostat": 0, "repeat_last_n": 64, "num_gpu": 99,
                 "num_predict": -1, "seed": -1},
    )  # fmt: skip
    assert p.request.max_tokens is None and p.request.sampling.seed is None


def test_past_calls_get_stable_ids_and_results_find_their_call() -> None:
    messages = [
        {"role": "user", "content": "both"},
        {"role": "assistant", "content": "", "thinking": "hmm", "tool_calls": [
            {"function": {"name": "a", "arguments": {"x": 1}}},
            {"function": {"name": "b", "arguments": "{\"y\": 2}"}}]},
        {"role": "tool", "content": "B", "tool_name": "b"},
        {"role": "tool", "content": "A", "tool_name": "a"},
    ]  # fmt: skip
    one, two = chat(messages=messages).request, chat(messages=messages).request
    calls = one.messages[1].tool_calls
    assert [c.id for c in calls] == [c.id for c in two.messages[1].tool_calls]
    assert [c.arguments for c in calls] == ['{"x":1}', '{"y":2}']
    assert one.messages[1].reasoning == "hmm"
    assert one.messages[2].tool_call_id == calls[1].id and one.messages[2].name == "b"
    assert one.messages[3].tool_call_id == calls[0].id


def test_generate_prompt_system_raw_suffix_and_empty_prompt() -> None:
    g = ollama.parse_generate({"model": "m", "prompt": "p", "system": "s"}, DEFAULTS)
    assert [(m.role, m.content) for m in g.request.messages] == [("system", "s"), ("user", "p")]
    raw = ollama.parse_generate({"model": "m", "prompt": "<s>p", "raw": True}, DEFAULTS)
    assert raw.request.raw_prompt == "<s>p"
    fim = ollama.parse_generate({"model": "m", "prompt": "a", "suffix": "b"}, DEFAULTS)
    assert fim.suffix == "b" and fim.prompt == "a" and fim.request.priority == "completion"
    assert ollama.parse_generate({"model": "m"}, DEFAULTS).load_only
    assert chat(messages=[]).load_only


@pytest.mark.parametrize(
    ("body", "word"),
    [({"prompt": "x", "images": ["aGk="]}, "images"), ({"prompt": "x", "format": "xml"}, "format"),
     ({"prompt": "x", "suffix": "y", "format": "json"}, "format"),
     ({"prompt": "x", "format": {"type": "string", "pattern": "a"}}, "pattern"),
     ({"prompt": "x", "context": [1, 2]}, "context"), ({"prompt": "x", "template": "{{ .P }}"},
     "template"), ({"prompt": 3}, "prompt")],
)  # fmt: skip
def test_generate_refusals(body: dict, word: str) -> None:
    with pytest.raises(ApiError) as e:
        ollama.parse_generate({"model": "m", **body}, DEFAULTS)
    assert e.value.status == 400 and word in e.value.message


def test_stream_lines_text_thinking_a_whole_tool_call_and_the_final_stats() -> None:
    t = ollama.Timings(total_ns=9, load_ns=1, prompt_eval_ns=3, eval_ns=4)
    s = ollama.Stream("m", True, lambda: t, clock=lambda: NOW)
    lines: list[str] = []
    for ev in (
        Usage(10, 0),
        ReasoningDelta("th"),
        TextDelta("hi"),
        ToolCallStart(0, "call_1", "ls"),
        ToolCallArgsDelta(0, '{"p":'),
        ToolCallEnd(0, '{"p":"/"}'),
        Usage(10, 3, cached_tokens=6),
        Finish("tool_calls"),
    ):
        lines += s.feed(ev)
    objs = [json.loads(line) for line in lines]
    assert all(line.endswith("\n") and "\n" not in line[:-1] for line in lines)
    assert objs[0]["message"] == {"role": "assistant", "content": "", "thinking": "th"}
    assert objs[1]["message"] == {"role": "assistant", "content": "hi"}
    assert objs[2]["message"]["tool_calls"] == [
        {"id": "call_1", "function": {"index": 0, "name": "ls", "arguments": {"p": "/"}}}
    ]
    final = objs[3]
    assert final["done"] is True and final["done_reason"] == "stop"
    assert final["created_at"] == "2025-01-02T03:04:05.678901Z"
    assert (final["prompt_eval_count"], final["eval_count"]) == (4, 3)  # 6 of 10 cached
    assert (final["total_duration"], final["load_duration"]) == (9, 1)
    assert (final["prompt_eval_duration"], final["eval_duration"]) == (3, 4)
    assert all(o["done"] is False for o in objs[:3])


def test_generate_stream_and_an_error_finish() -> None:
    s = ollama.Stream("m", False, lambda: ollama.Timings(), clock=lambda: NOW)
    assert json.loads(s.feed(TextDelta("x"))[0]) == {
        "model": "m", "created_at": "2025-01-02T03:04:05.678901Z", "response": "x",
        "done": False}  # fmt: skip
    assert json.loads(s.feed(Finish("error", "engine failed"))[0]) == {"error": "engine failed"}


def test_non_streaming_bodies() -> None:
    c = Completion(text="hi", reasoning="r", tool_calls=[ToolCall("c1", "ls", "{}")],
                   usage=Usage(5, 2), finish=Finish("length"))  # fmt: skip
    body = ollama.chat_response(c, "m", NOW, ollama.Timings(total_ns=5))
    assert body["message"]["thinking"] == "r" and body["done_reason"] == "length"
    assert body["message"]["tool_calls"][0]["function"]["arguments"] == {}
    gen = ollama.generate_response(c, "m", NOW, ollama.Timings())
    assert gen["response"] == "hi" and gen["thinking"] == "r" and gen["eval_count"] == 2


def test_speculative_is_an_option() -> None:
    p = chat(messages=[{"role": "user", "content": "x"}], options={"speculative": False})
    assert p.request.sampling.speculative is False
    with pytest.raises(ApiError) as e:
        chat(messages=[{"role": "user", "content": "x"}], options={"speculative": 1})
    assert e.value.status == 400 and "speculative" in e.value.message
