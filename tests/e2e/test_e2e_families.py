"""The daemon is family-agnostic: a (synthetic) DeepSeek V4 GGUF is served through its
own chat format — V4 encoding, thinking split, DSML tool calls — by the same HTTP layer
and slots, to the real openai and anthropic SDKs, on all four APIs.

The synthetic model's weights are random, so its text is noise: these tests check the
protocol (shapes, usage, the reasoning/answer split, tool calls that parse, KV reuse),
with fixed seeds where a test needs particular first tokens."""

from __future__ import annotations

import json
from pathlib import Path

import anthropic
import openai
import pytest

from ds4d.tools.synth import write_deepseek4
from tests.e2e.daemon_process import check_usage, running_daemon, traces
from tests.e2e.daemon_process import trace_of as traced

# Every kind of DSML parameter: raw string, raw enum choice, JSON number and object (whose
# forced spacing differs from the canonical rendering: only exact replay reuses the KV).
WEATHER = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "Weather forecast for a city",
        "parameters": {
            "type": "object",
            "required": ["city", "days", "unit", "at"],
            "properties": {
                "city": {"type": "string"},
                "days": {"type": "integer"},
                "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]},
                "at": {
                    "type": "object",
                    "required": ["lat"],
                    "properties": {"lat": {"type": "number"}},
                },
            },
        },
    },
}
REQUIRED = {"city", "days", "unit", "at"}
HI = [{"role": "user", "content": "hi"}]


@pytest.fixture(scope="module")
def model(tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("ds4d-v4-model") / "synthetic-v4.gguf"
    write_deepseek4(path)
    return path


@pytest.fixture(scope="module")
def daemon(tmp_path_factory, model):
    tmp = tmp_path_factory.mktemp("ds4d-v4")
    with running_daemon(
        tmp, "-m", str(model), "--ctx", "2048", "--trace", str(tmp / "trace.jsonl")
    ) as d:
        d.trace_path = tmp / "trace.jsonl"
        yield d


@pytest.fixture(scope="module")
def oai(daemon) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{daemon.url}/v1", api_key="x", max_retries=0)


@pytest.fixture(scope="module")
def claude(daemon) -> anthropic.Anthropic:
    return anthropic.Anthropic(base_url=daemon.url, api_key="x", max_retries=0)


def trace_of(path: Path, usage) -> dict:
    """The trace record of the request that reported `usage`."""
    return traced(path, usage.prompt_tokens, usage.prompt_tokens_details.cached_tokens)


# -- OpenAI chat completions ------------------------------------------------------------


def test_chat_thinks_by_default_and_answers_plainly_with_effort_none(oai):
    # Thinking is V4's default: the prompt ends inside <think>, so with a budget of a few
    # tokens everything generated is reasoning (seeded: the first tokens are fixed).
    r = oai.chat.completions.create(model="deepseek-v4-flash", max_tokens=6, seed=7, messages=HI)
    check_usage(r.usage.prompt_tokens, r.usage.completion_tokens, r.usage.total_tokens, 6)
    assert r.choices[0].message.model_extra.get("reasoning_content")
    assert not r.choices[0].message.content
    plain = oai.chat.completions.create(
        model="m", max_tokens=6, seed=7, messages=HI, reasoning_effort="none"
    )
    check_usage(
        plain.usage.prompt_tokens, plain.usage.completion_tokens, plain.usage.total_tokens, 6
    )
    assert plain.choices[0].message.content
    assert plain.choices[0].message.model_extra.get("reasoning_content") is None
    # the two prompts differ only in the think tag the answer opens with
    assert plain.usage.prompt_tokens == r.usage.prompt_tokens
    # the DeepSeek API's non-thinking model name, without any thinking control
    alias = oai.chat.completions.create(model="deepseek-chat", max_tokens=6, seed=7, messages=HI)
    assert alias.choices[0].message.content
    assert alias.choices[0].message.model_extra.get("reasoning_content") is None


def test_chat_streamed_splits_reasoning_from_content(oai):
    def stream(**kw) -> tuple[str, str, list]:
        chunks = list(
            oai.chat.completions.create(
                model="m",
                max_tokens=6,
                seed=7,
                messages=HI,
                stream=True,
                stream_options={"include_usage": True},
                **kw,
            )
        )
        deltas = [c.choices[0].delta for c in chunks if c.choices]
        reasoning = "".join(d.model_extra.get("reasoning_content") or "" for d in deltas)
        return reasoning, "".join(d.content or "" for d in deltas), chunks

    reasoning, content, chunks = stream()
    assert reasoning and not content
    usage = chunks[-1].usage
    check_usage(usage.prompt_tokens, usage.completion_tokens, usage.total_tokens, 6)
    reasoning, content, chunks = stream(reasoning_effort="none")
    assert content and not reasoning
    assert [c.choices[0].finish_reason for c in chunks if c.choices][-1] in ("length", "stop")


# -- legacy completions -------------------------------------------------------------------


def test_completions_return_raw_text(oai):
    r = oai.completions.create(model="m", prompt="hello", max_tokens=6, seed=1)
    check_usage(r.usage.prompt_tokens, r.usage.completion_tokens, r.usage.total_tokens, 6)
    assert r.choices[0].text and r.choices[0].finish_reason in ("length", "stop")
    chunks = list(
        oai.completions.create(
            model="m",
            prompt="hello",
            max_tokens=6,
            seed=1,
            stream=True,
            stream_options={"include_usage": True},
        )
    )
    assert "".join(c.choices[0].text for c in chunks if c.choices)
    assert chunks[-1].usage.prompt_tokens == r.usage.prompt_tokens


# -- Responses ---------------------------------------------------------------------------


def test_responses_reasoning_item_then_plain_message_without_thinking(oai):
    # Seeded: unseeded, a random draw could close the thinking and stop within 6 tokens.
    seeded = {"seed": 7}
    r = oai.responses.create(model="m", input="hi", max_output_tokens=6, extra_body=seeded)
    u = r.usage
    check_usage(u.input_tokens, u.output_tokens, u.total_tokens, 6)
    assert r.output[0].type == "reasoning" and r.output[0].summary[0].text
    assert r.status == "incomplete" and r.incomplete_details.reason == "max_output_tokens"
    plain = oai.responses.create(
        model="m",
        input="hi",
        max_output_tokens=6,
        reasoning={"effort": "none"},
        extra_body=seeded,
    )
    assert [o.type for o in plain.output] == ["message"] and plain.output_text
    events = list(
        oai.responses.create(
            model="m", input="hi", max_output_tokens=6, stream=True, extra_body=seeded
        )
    )
    kinds = [e.type for e in events]
    assert kinds[-1] == "response.incomplete"  # the budget ran out while thinking
    assert any(k.startswith("response.reasoning") and k.endswith(".delta") for k in kinds)
    final = events[-1].response
    assert final.output[0].type == "reasoning"
    assert final.usage.input_tokens == u.input_tokens


# -- Anthropic messages --------------------------------------------------------------------


def test_messages_thinking_blocks_and_disabled_thinking(claude):
    m = claude.messages.create(
        model="c",
        max_tokens=6,
        extra_body={"seed": 7},
        thinking={"type": "enabled", "budget_tokens": 1024},
        messages=HI,
    )
    assert m.content[0].type == "thinking" and m.content[0].thinking
    assert m.stop_reason == "max_tokens" and 1 <= m.usage.output_tokens <= 6
    # Messages API: the prompt is what was read from, written to, or kept out of a cache.
    prompt = (
        m.usage.input_tokens + m.usage.cache_read_input_tokens + m.usage.cache_creation_input_tokens
    )
    counted = claude.messages.count_tokens(
        model="c", messages=HI, thinking={"type": "enabled", "budget_tokens": 1024}
    )
    assert counted.input_tokens == prompt > 1

    with claude.messages.stream(
        model="c", max_tokens=6, extra_body={"seed": 7}, thinking={"type": "disabled"}, messages=HI
    ) as s:
        kinds = {e.type for e in s}
        final = s.get_final_message()
    assert [b.type for b in final.content] == ["text"] and final.content[0].text
    assert "content_block_delta" in kinds and final.usage.output_tokens >= 1
    # the think tag the answer opens with is one token either way
    u = final.usage
    assert u.input_tokens + u.cache_read_input_tokens + u.cache_creation_input_tokens == prompt


# -- forced tool calls (DSML) ------------------------------------------------------------


def test_forced_call_parses_and_its_result_reuses_the_kv(oai, daemon):
    """Even the random model writes a parseable DSML call when the tool is forced; the
    tool result turn renders that call back byte for byte, so the slot's KV is reused
    past it (the call's exact block comes from the tool memory, not from the client's
    re-serialized JSON)."""
    messages = [{"role": "user", "content": "Weather in Paris for 3 days?"}]
    r = oai.chat.completions.create(
        model="m",
        messages=messages,
        tools=[WEATHER],
        tool_choice="required",
        max_tokens=8,
        seed=3,
        reasoning_effort="none",
    )
    choice = r.choices[0]
    assert choice.finish_reason == "tool_calls" and not choice.message.content
    (call,) = choice.message.tool_calls
    args = json.loads(call.function.arguments)
    assert call.function.name == "get_weather" and set(args) == REQUIRED
    assert isinstance(args["city"], str) and isinstance(args["days"], int)
    assert args["unit"] in ("celsius", "fahrenheit") and isinstance(args["at"]["lat"], int)

    sent_back = json.dumps(dict(reversed(args.items())), indent=2)  # other order, spacing
    messages += [
        {
            "role": "assistant",
            "content": None,
            "tool_calls": [
                {
                    "id": call.id,
                    "type": "function",
                    "function": {"name": "get_weather", "arguments": sent_back},
                }
            ],
        },
        {"role": "tool", "tool_call_id": call.id, "content": "sunny, 25C"},
    ]
    r2 = oai.chat.completions.create(
        model="m", messages=messages, tools=[WEATHER], max_tokens=4, seed=3, reasoning_effort="none"
    )
    held = r.usage.prompt_tokens + r.usage.completion_tokens
    assert r2.usage.prompt_tokens > held
    assert r2.usage.prompt_tokens_details.cached_tokens >= held - 2
    assert trace_of(daemon.trace_path, r2.usage)["cache_source"] in ("memory-token", "memory-text")


def test_forced_call_streamed_while_thinking(oai, claude):
    chunks = list(
        oai.chat.completions.create(
            model="m",
            stream=True,
            max_tokens=8,
            seed=5,
            tools=[WEATHER],
            tool_choice={"type": "function", "function": {"name": "get_weather"}},
            messages=[{"role": "user", "content": "Weather in Oslo?"}],
        )
    )
    deltas = [tc for c in chunks if c.choices for tc in (c.choices[0].delta.tool_calls or [])]
    assert deltas[0].id and deltas[0].function.name == "get_weather"
    assert len(deltas) > 2  # the arguments arrive piece by piece
    assert set(json.loads("".join(d.function.arguments or "" for d in deltas))) == REQUIRED
    assert chunks[-1].choices[0].finish_reason == "tool_calls"
    assert not any("DSML" in (c.choices[0].delta.content or "") for c in chunks if c.choices)

    tool = {"name": "get_weather", "input_schema": WEATHER["function"]["parameters"]}
    with claude.messages.stream(
        model="c",
        max_tokens=8,
        tools=[tool],
        tool_choice={"type": "tool", "name": "get_weather"},
        messages=[{"role": "user", "content": "Weather in Rome?"}],
    ) as s:
        final = s.get_final_message()
    use = next(b for b in final.content if b.type == "tool_use")
    assert final.stop_reason == "tool_use" and set(use.input) == REQUIRED


def test_forced_call_is_completed_past_max_tokens(oai):
    """A long call (a dozen free-text values) is finished whatever max_tokens says: cut
    off, the block would come back as text."""
    keys = [f"field_{i}" for i in range(12)]
    form = {
        "type": "function",
        "function": {
            "name": "fill_form",
            "parameters": {
                "type": "object",
                "required": keys,
                "properties": {k: {"type": "string"} for k in keys},
            },
        },
    }
    r = oai.chat.completions.create(
        model="m",
        messages=HI,
        tools=[form],
        max_tokens=1,
        tool_choice="required",
        reasoning_effort="none",
    )
    assert r.choices[0].finish_reason == "tool_calls" and r.usage.completion_tokens > 384
    (call,) = r.choices[0].message.tool_calls
    assert list(json.loads(call.function.arguments)) == keys


def test_responses_forced_function_call_round_trip(oai):
    tool = {
        "type": "function",
        "name": "get_weather",
        "parameters": WEATHER["function"]["parameters"],
    }
    r = oai.responses.create(
        model="m",
        input="Weather in Lima?",
        tools=[tool],
        tool_choice="required",
        max_output_tokens=8,
    )
    (call,) = [o for o in r.output if o.type == "function_call"]
    assert call.name == "get_weather" and set(json.loads(call.arguments)) == REQUIRED
    r2 = oai.responses.create(
        model="m",
        tools=[tool],
        max_output_tokens=4,
        input=[
            {"role": "user", "content": "Weather in Lima?"},
            *[o.model_dump(exclude_none=True) for o in r.output],
            {"type": "function_call_output", "call_id": call.call_id, "output": "foggy"},
        ],
    )
    assert r2.usage.input_tokens_details.cached_tokens >= r.usage.total_tokens - 2


# -- disk KV -------------------------------------------------------------------------------


def test_disk_checkpoint_survives_a_restart(tmp_path, model):
    """SIGTERM writes the conversation's KV to disk; a fresh daemon answers the same
    conversation plus one user-side turn (the tool's result) from that file: cache source
    disk-text, everything the first daemon held reused. The first turn is a forced call
    (valid UTF-8 whatever the random weights pick: a session holding a stray byte has no
    text key and is not saved), so the exact DSML replay after a restart is covered too:
    it comes from the tool map stored in the KV file."""
    kv, trace = tmp_path / "kv", tmp_path / "trace.jsonl"
    args = (
        "-m",
        str(model),
        "--ctx",
        "2048",
        "--slots",
        "1",
        "--kv-disk",
        "--kv-disk-dir",
        str(kv),
        "--trace",
        str(trace),
        "--kv-cache-min-tokens",
        "32",
        "--kv-cache-boundary-align-tokens",
        "0",
    )
    messages = [{"role": "user", "content": "Will it rain in Paris tomorrow?"}]
    with running_daemon(tmp_path, *args) as d:
        c = openai.OpenAI(base_url=f"{d.url}/v1", api_key="x", max_retries=0)
        first = c.chat.completions.create(
            model="m",
            messages=messages,
            tools=[WEATHER],
            tool_choice="required",
            max_tokens=8,
            seed=11,
            reasoning_effort="none",
        )
    assert "1 shutdown checkpoint(s) written" in d.log()

    (call,) = first.choices[0].message.tool_calls
    args_back = json.dumps(json.loads(call.function.arguments), indent=1)
    messages += [
        {
            "role": "assistant",
            "content": None,
            "tool_calls": [
                {
                    "id": call.id,
                    "type": "function",
                    "function": {"name": "get_weather", "arguments": args_back},
                }
            ],
        },
        {"role": "tool", "tool_call_id": call.id, "content": "light rain"},
    ]
    with running_daemon(tmp_path, *args) as d:
        c = openai.OpenAI(base_url=f"{d.url}/v1", api_key="x", max_retries=0)
        second = c.chat.completions.create(
            model="m", messages=messages, tools=[WEATHER], max_tokens=4, reasoning_effort="none"
        )
    cold, warm = traces(trace)
    assert (cold["cache_source"], warm["cache_source"]) == ("none", "disk-text")
    assert warm["disk_file"] in {p.name for p in kv.glob("*.kv")}
    # the shutdown checkpoint: the prompt and the call
    cached = second.usage.prompt_tokens_details.cached_tokens
    assert cached == warm["cached_tokens"] == first.usage.total_tokens
