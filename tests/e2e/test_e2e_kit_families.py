"""Every model family of the verification kit served end to end: a real `ds4d serve` on
the family's tiny random GGUF with the chat template of the release users run, spoken to
by the real openai and anthropic SDKs on all four APIs.

The weights are random, so the text is noise: the tests check the protocol — usage on
every API, streamed and not; a forced call of the declared tool, written in the family's
own syntax (seen in the next turn's prompt, which replays it) and reused from the KV by
the tool result turn; the thinking switch and the reasoning split; a second turn served
from the cache; and a SIGTERM restart that answers from the disk checkpoint.

A random model never opens `<think>` or harmony's `analysis` channel on its own, so the
reasoning split is exercised where a real template opens the thinking itself (QwQ, a
qwen2 model); Qwen 3's and gpt-oss's thinking switches are checked in the prompt."""

from __future__ import annotations

import json
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import anthropic
import openai
import pytest

from ds4d.engine.gguf_file import GGUFFile
from tests.e2e.daemon_process import Daemon, check_usage, running_daemon, trace_of, traces
from tests.e2e.kit_gguf import with_metadata
from tests.helpers.kit import kit_model

TEMPLATES = Path(__file__).resolve().parent.parent / "data" / "templates"
E2E_TEMPLATES = Path(__file__).resolve().parent / "templates"

HERMES = '<tool_call>\n{"name": "get_weather", "arguments": {'
LLAMA = '{"name": "get_weather", "parameters": {'
QWEN_XML = "<tool_call>\n<function=get_weather>\n<parameter="
HARMONY = "<|channel|>commentary to=functions.get_weather <|constrain|>json<|message|>{"


@dataclass(frozen=True)
class Family:
    kit: str  # the kit fixture's family
    call_markup: str  # how the family's template writes the forced call back
    template: Path | None = None  # replaces the kit GGUF's template
    token_names: dict[int, str] = field(default_factory=dict)
    thinking: str = ""  # "opens": the prompt opens <think>; "switch": enable_thinking
    # The template drops the generation prompt's think tags from the turn it renders
    # back, so the next turn reuses the KV only up to them (a few tokens short).
    drops_think_tags: bool = False
    known_bug: str = ""  # why the call's tokens are not reused (xfail, strict)


FAMILIES = {
    # The kit's llama carries Llama 3's template and vocabulary: Llama 3.1 (tools) names
    # three of its reserved tokens.
    "llama": Family(
        "llama",
        LLAMA,
        TEMPLATES / "meta-llama-Llama-3.1-8B-Instruct.jinja",
        {128004: "<|finetune_right_pad_id|>", 128008: "<|eom_id|>", 128010: "<|python_tag|>"},
    ),
    "qwen2": Family("qwen2", HERMES),  # Qwen2.5-Instruct's template
    "qwq": Family(
        "qwen2",
        HERMES,
        E2E_TEMPLATES / "Qwen-QwQ-32B.jinja",
        thinking="opens",
        drops_think_tags=True,
    ),
    "qwen3": Family("qwen3", HERMES, thinking="switch"),  # Qwen3's template
    "qwen3moe": Family("qwen3moe", HERMES, thinking="switch"),
    # Qwen3-Coder-30B-A3B is a qwen3moe model with its own template and XML calls.
    "qwen3coder": Family("qwen3moe", QWEN_XML, TEMPLATES / "Qwen3-Coder.jinja"),
    # Gemma 3's and Phi-3.5's templates know no tools: ds4d's Hermes block stands in.
    "gemma3": Family("gemma3", HERMES),
    # SentencePiece with add_space_prefix: a space piece after every special token.
    "phi3": Family("phi3", HERMES),
    "gpt-oss": Family("gpt-oss", HARMONY),  # harmony
}

WEATHER = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "Weather forecast for a city",
        "parameters": {
            "type": "object",
            "required": ["city", "days"],
            "properties": {"city": {"type": "string"}, "days": {"type": "integer"}},
        },
    },
}
REQUIRED = {"city", "days"}
# The tokens of the think tags (`<think>\n</think>` and the newlines around them) that
# QwQ's generation prompt holds and its rendering of that turn drops.
THINK_TAGS = 6
HI = [{"role": "user", "content": "hi"}]
ASK = [{"role": "user", "content": "Weather in Paris for 3 days?"}]


@dataclass
class Served:
    name: str
    family: Family
    daemon: Daemon
    trace: Path
    oai: openai.OpenAI
    claude: anthropic.Anthropic


@pytest.fixture(scope="module")
def model_files(tmp_path_factory) -> dict[str, Path]:
    """name -> the GGUF served for it (the kit's file, or a copy with its template)."""
    out: dict[str, Path] = {}
    tmp = tmp_path_factory.mktemp("kit-models")
    for name, fam in FAMILIES.items():
        path = kit_model(fam.kit)
        if fam.template is not None:
            path = with_metadata(
                path, tmp / f"{name}.gguf", fam.template.read_text(), fam.token_names
            )
        out[name] = path
    return out


def test_metadata_rewrite_keeps_the_rest_of_the_file(tmp_path: Path, model_files) -> None:
    """Unchanged metadata writes the kit's file back byte for byte; a new template moves
    the data section but keeps every tensor's bytes."""
    src = kit_model("llama")
    assert with_metadata(src, tmp_path / "same.gguf").read_bytes() == src.read_bytes()
    changed = model_files["llama"].read_bytes()
    original = src.read_bytes()
    assert (TEMPLATES / "meta-llama-Llama-3.1-8B-Instruct.jinja").read_bytes() in changed
    assert b"<|python_tag|>" in changed and b"<|python_tag|>" not in original
    before, after = GGUFFile(src), GGUFFile(model_files["llama"])
    assert after.tensor_names() == before.tensor_names()
    for name in before.tensor_names():
        t, u = before.tensor(name), after.tensor(name)
        assert (u.type, u.shape) == (t.type, t.shape)
        assert u.data.tobytes() == t.data.tobytes(), name


def serve_args(model: Path, trace: Path, *extra: str) -> tuple[str, ...]:
    return ("-m", str(model), "--ctx", "1024", "--threads", "1", "--trace", str(trace),
            "--trace-content", "--kv-cache-min-tokens", "16", *extra)  # fmt: skip


@pytest.fixture(scope="module", params=list(FAMILIES))
def served(request, tmp_path_factory, model_files) -> Iterator[Served]:
    name = request.param
    tmp = tmp_path_factory.mktemp(f"serve-{name}")
    trace = tmp / "trace.jsonl"
    with running_daemon(tmp, *serve_args(model_files[name], trace)) as d:
        yield Served(
            name,
            FAMILIES[name],
            d,
            trace,
            openai.OpenAI(base_url=f"{d.url}/v1", api_key="x", max_retries=0),
            anthropic.Anthropic(base_url=d.url, api_key="x", max_retries=0),
        )


def reasoning_of(message) -> str | None:
    return (message.model_extra or {}).get("reasoning_content")


def no_thinking(s: Served) -> dict:
    """The request option that switches the family's thinking off, where it has one."""
    return {"reasoning_effort": "none"} if s.family.thinking else {}


# -- the four APIs answer, with usage ------------------------------------------------------


def test_chat_completions_answer_with_usage(served: Served) -> None:
    r = served.oai.chat.completions.create(
        model="m", messages=HI, max_tokens=5, seed=1, **no_thinking(served)
    )
    u = r.usage
    check_usage(u.prompt_tokens, u.completion_tokens, u.total_tokens, 5)
    assert r.choices[0].finish_reason in ("length", "stop")
    assert r.choices[0].message.content or r.choices[0].finish_reason == "stop"
    assert not reasoning_of(r.choices[0].message)

    chunks = list(
        served.oai.chat.completions.create(
            model="m", messages=HI, max_tokens=5, seed=1, stream=True,
            stream_options={"include_usage": True}, **no_thinking(served),
        )
    )  # fmt: skip
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text == (r.choices[0].message.content or "")  # same seed, same tokens
    assert chunks[-1].usage.prompt_tokens == u.prompt_tokens
    assert chunks[-1].usage.completion_tokens == u.completion_tokens


def test_completions_answer_raw_text_with_usage(served: Served) -> None:
    r = served.oai.completions.create(model="m", prompt="hello there", max_tokens=5, seed=2)
    u = r.usage
    check_usage(u.prompt_tokens, u.completion_tokens, u.total_tokens, 5)
    chunks = list(
        served.oai.completions.create(
            model="m", prompt="hello there", max_tokens=5, seed=2, stream=True,
            stream_options={"include_usage": True},
        )
    )  # fmt: skip
    assert "".join(c.choices[0].text for c in chunks if c.choices) == r.choices[0].text
    assert chunks[-1].usage.prompt_tokens == u.prompt_tokens


def test_responses_answer_with_usage(served: Served) -> None:
    effort = {"reasoning": {"effort": "none"}} if served.family.thinking else {}
    r = served.oai.responses.create(model="m", input="hi", max_output_tokens=5, **effort)
    u = r.usage
    check_usage(u.input_tokens, u.output_tokens, u.total_tokens, 5)
    assert [o.type for o in r.output] == ["message"]
    events = list(
        served.oai.responses.create(
            model="m", input="hi", max_output_tokens=5, stream=True, **effort
        )
    )
    assert events[-1].type in ("response.completed", "response.incomplete")
    assert events[-1].response.usage.input_tokens == u.input_tokens


def test_anthropic_messages_answer_with_usage(served: Served) -> None:
    off = {"thinking": {"type": "disabled"}} if served.family.thinking else {}
    m = served.claude.messages.create(
        model="c", max_tokens=5, messages=HI, extra_body={"seed": 3}, **off
    )
    assert [b.type for b in m.content] in (["text"], [])
    assert 1 <= m.usage.output_tokens <= 5
    # Messages API: the prompt is what was read from, written to, or kept out of a cache.
    prompt = (
        m.usage.input_tokens + m.usage.cache_read_input_tokens + m.usage.cache_creation_input_tokens
    )
    assert prompt > 1
    counted = served.claude.messages.count_tokens(model="c", messages=HI, **off)
    assert counted.input_tokens == prompt
    with served.claude.messages.stream(
        model="c", max_tokens=5, messages=HI, extra_body={"seed": 3}, **off
    ) as s:
        final = s.get_final_message()
    assert [b.model_dump()["text"] for b in final.content] == [b.text for b in m.content]
    assert final.usage.output_tokens == m.usage.output_tokens


# -- forced tool calls ---------------------------------------------------------------------


def known_bug(request, served: Served) -> None:
    if served.family.known_bug:
        request.applymarker(pytest.mark.xfail(reason=served.family.known_bug, strict=True))


def test_forced_call_round_trip_in_native_syntax_reuses_the_kv(request, served: Served) -> None:
    known_bug(request, served)
    r = served.oai.chat.completions.create(
        model="m", messages=ASK, tools=[WEATHER], tool_choice="required", max_tokens=8, seed=4
    )
    choice = r.choices[0]
    assert choice.finish_reason == "tool_calls" and not choice.message.content
    (call,) = choice.message.tool_calls
    args = json.loads(call.function.arguments)
    assert call.function.name == "get_weather" and set(args) == REQUIRED
    assert isinstance(args["city"], str) and isinstance(args["days"], int)

    # The client sends the arguments back re-serialized (other order, spacing).
    sent_back = json.dumps(dict(reversed(args.items())), indent=2)
    turn = [
        *ASK,
        {"role": "assistant", "content": None, "tool_calls": [{
            "id": call.id, "type": "function",
            "function": {"name": "get_weather", "arguments": sent_back}}]},
        {"role": "tool", "tool_call_id": call.id, "content": "sunny, 25C"},
    ]  # fmt: skip
    r2 = served.oai.chat.completions.create(
        model="m", messages=turn, tools=[WEATHER], max_tokens=4, seed=4
    )
    held = r.usage.prompt_tokens + r.usage.completion_tokens
    cached = r2.usage.prompt_tokens_details.cached_tokens
    first = trace_of(
        served.trace, r.usage.prompt_tokens, r.usage.prompt_tokens_details.cached_tokens
    )
    second = trace_of(served.trace, r2.usage.prompt_tokens, cached)
    assert second["cache_source"] in ("memory-token", "memory-text")
    head = first["prompt"]
    if served.family.drops_think_tags:
        head = head[: head.rindex("<think>")]
        assert r2.usage.prompt_tokens > held and cached >= r.usage.prompt_tokens - THINK_TAGS
    else:
        assert r2.usage.prompt_tokens > held and cached >= held - 2
    # The call is written back in the family's syntax, right where the model wrote it.
    assert second["prompt"].startswith(head)
    replayed = second["prompt"][len(head) :]
    assert served.family.call_markup in replayed
    raw = served.family.call_markup == QWEN_XML  # values written as they are, not JSON
    city = args["city"] if raw else json.dumps(args["city"], ensure_ascii=False)
    assert city in replayed


def test_named_call_streamed_and_anthropic_tool_choice(served: Served) -> None:
    chunks = list(
        served.oai.chat.completions.create(
            model="m", messages=ASK, tools=[WEATHER], max_tokens=8, seed=5, stream=True,
            tool_choice={"type": "function", "function": {"name": "get_weather"}},
            **no_thinking(served),
        )
    )  # fmt: skip
    deltas = [t for c in chunks if c.choices for t in (c.choices[0].delta.tool_calls or [])]
    assert deltas[0].id and deltas[0].function.name == "get_weather"
    assert set(json.loads("".join(d.function.arguments or "" for d in deltas))) == REQUIRED
    assert [c.choices[0].finish_reason for c in chunks if c.choices][-1] == "tool_calls"
    # no markup leaks as text
    assert not "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)

    tool = {"name": "get_weather", "input_schema": WEATHER["function"]["parameters"]}
    off = {"thinking": {"type": "disabled"}} if served.family.thinking else {}
    with served.claude.messages.stream(
        model="c", max_tokens=8, messages=ASK, tools=[tool],
        tool_choice={"type": "tool", "name": "get_weather"}, **off,
    ) as s:  # fmt: skip
        final = s.get_final_message()
    (use,) = [b for b in final.content if b.type == "tool_use"]
    assert final.stop_reason == "tool_use" and use.name == "get_weather"
    assert set(use.input) == REQUIRED


def test_responses_forced_function_call_round_trip(request, served: Served) -> None:
    known_bug(request, served)
    tool = {"type": "function", "name": "get_weather",
            "parameters": WEATHER["function"]["parameters"]}  # fmt: skip
    r = served.oai.responses.create(
        model="m", input="Weather in Lima?", tools=[tool], tool_choice="required",
        max_output_tokens=8,
    )  # fmt: skip
    (call,) = [o for o in r.output if o.type == "function_call"]
    assert call.name == "get_weather" and set(json.loads(call.arguments)) == REQUIRED
    r2 = served.oai.responses.create(
        model="m", tools=[tool], max_output_tokens=4,
        input=[
            {"role": "user", "content": "Weather in Lima?"},
            *[o.model_dump(exclude_none=True) for o in r.output],
            {"type": "function_call_output", "call_id": call.call_id, "output": "foggy"},
        ],
    )  # fmt: skip
    cached = r2.usage.input_tokens_details.cached_tokens
    if served.family.drops_think_tags:
        assert cached >= r.usage.input_tokens - THINK_TAGS
    else:
        assert cached >= r.usage.total_tokens - 2


# -- a second turn from the cache ----------------------------------------------------------


def test_second_turn_is_served_from_the_cache(served: Served) -> None:
    talk = [{"role": "user", "content": "Tell me about lighthouses, their keepers and the "
             "ledgers they kept of every ship that passed the northern point."}]  # fmt: skip
    r = served.oai.chat.completions.create(model="m", messages=talk, max_tokens=4, seed=6)
    talk += [
        {"role": "assistant", "content": r.choices[0].message.content or ""},
        {"role": "user", "content": "And the keepers?"},
    ]
    r2 = served.oai.chat.completions.create(model="m", messages=talk, max_tokens=4, seed=6)
    # Templates that trim the reply, or drop the think tags, give back a few tokens less
    # than the slot holds: the common prefix is reused.
    cached = r2.usage.prompt_tokens_details.cached_tokens
    margin = THINK_TAGS if served.family.drops_think_tags else 4
    assert r.usage.prompt_tokens - margin <= cached < r2.usage.prompt_tokens


# -- thinking ------------------------------------------------------------------------------


def test_thinking_switch_or_split(served: Served) -> None:
    kind = served.family.thinking
    if not kind:
        pytest.skip(f"{served.name}: no enable_thinking switch, no prompt that opens <think>")
    if kind == "switch":
        # Qwen 3: thinking off renders the closed empty block the model answers after.
        on = served.oai.chat.completions.create(model="m", messages=HI, max_tokens=2, seed=7)
        off = served.oai.chat.completions.create(
            model="m", messages=HI, max_tokens=2, seed=7, reasoning_effort="none"
        )
        u_on, u_off = on.usage, off.usage
        on_prompt = trace_of(served.trace, u_on.prompt_tokens, 0)["prompt"]
        off_prompt = trace_of(
            served.trace, u_off.prompt_tokens, u_off.prompt_tokens_details.cached_tokens
        )["prompt"]
        assert on_prompt.endswith("<|im_start|>assistant\n")
        assert off_prompt == on_prompt + "<think>\n\n</think>\n\n"
        return
    # Thinking on, the prompt opens <think>: with a budget of a few tokens everything
    # generated is reasoning.
    on = {"reasoning_effort": "high"}
    r = served.oai.chat.completions.create(model="m", messages=HI, max_tokens=5, seed=7, **on)
    assert reasoning_of(r.choices[0].message) and not r.choices[0].message.content
    chunks = list(
        served.oai.chat.completions.create(
            model="m", messages=HI, max_tokens=5, seed=7, stream=True, **on
        )
    )
    deltas = [c.choices[0].delta for c in chunks if c.choices]
    assert "".join((d.model_extra or {}).get("reasoning_content") or "" for d in deltas) == (
        reasoning_of(r.choices[0].message)
    )
    assert not "".join(d.content or "" for d in deltas)

    resp = served.oai.responses.create(
        model="m", input="hi", max_output_tokens=5, reasoning={"effort": "high"}
    )
    assert resp.output[0].type == "reasoning" and resp.output[0].summary[0].text
    m = served.claude.messages.create(
        model="c", max_tokens=5, messages=HI, extra_body={"seed": 7},
        thinking={"type": "enabled", "budget_tokens": 1024},
    )  # fmt: skip
    assert m.content[0].type == "thinking" and m.content[0].thinking
    # A forced call closes the thinking first: the call still parses.
    f = served.oai.chat.completions.create(
        model="m", messages=ASK, tools=[WEATHER], tool_choice="required", max_tokens=8,
        seed=7, **on,
    )  # fmt: skip
    (call,) = f.choices[0].message.tool_calls
    assert set(json.loads(call.function.arguments)) == REQUIRED


def test_reasoning_effort_reaches_the_harmony_prompt(served: Served) -> None:
    if served.family.call_markup != HARMONY:
        pytest.skip("only gpt-oss reads reasoning_effort")
    r = served.oai.chat.completions.create(
        model="m", messages=HI, max_tokens=2, seed=8, reasoning_effort="high"
    )
    u = r.usage
    prompt = trace_of(served.trace, u.prompt_tokens, u.prompt_tokens_details.cached_tokens)
    assert "Reasoning: high" in prompt["prompt"]


# -- the disk checkpoint across a restart --------------------------------------------------


@pytest.mark.slow
@pytest.mark.parametrize("name", [n for n, f in FAMILIES.items() if not f.drops_think_tags])
def test_disk_checkpoint_survives_a_restart(
    request, name: str, tmp_path: Path, model_files
) -> None:
    """SIGTERM writes the conversation's KV to disk; a fresh daemon answers the tool
    result turn from that file (cache source disk-text), everything the first daemon
    held reused, the forced call replayed exactly from the tool map in the file."""
    kv, trace = tmp_path / "kv", tmp_path / "trace.jsonl"
    args = serve_args(
        model_files[name], trace, "--slots", "1", "--kv-disk", "--kv-disk-dir", str(kv),
        "--kv-cache-boundary-align-tokens", "0",
    )  # fmt: skip
    if FAMILIES[name].known_bug:
        request.applymarker(pytest.mark.xfail(reason=FAMILIES[name].known_bug, strict=True))
    with running_daemon(tmp_path, *args) as d:
        c = openai.OpenAI(base_url=f"{d.url}/v1", api_key="x", max_retries=0)
        first = c.chat.completions.create(
            model="m", messages=ASK, tools=[WEATHER], tool_choice="required", max_tokens=8,
            seed=11,
        )  # fmt: skip
    assert "1 shutdown checkpoint(s) written" in d.log()

    (call,) = first.choices[0].message.tool_calls
    turn = [
        *ASK,
        {"role": "assistant", "content": None, "tool_calls": [{
            "id": call.id, "type": "function",
            "function": {"name": "get_weather", "arguments": call.function.arguments}}]},
        {"role": "tool", "tool_call_id": call.id, "content": "light rain"},
    ]  # fmt: skip
    with running_daemon(tmp_path, *args) as d:
        c = openai.OpenAI(base_url=f"{d.url}/v1", api_key="x", max_retries=0)
        second = c.chat.completions.create(model="m", messages=turn, tools=[WEATHER], max_tokens=4)
    cold, warm = traces(trace)
    assert (cold["cache_source"], warm["cache_source"]) == ("none", "disk-text")
    assert warm["disk_file"] in {p.name for p in kv.glob("*.kv")}
    cached = second.usage.prompt_tokens_details.cached_tokens
    assert cached == warm["cached_tokens"] == first.usage.total_tokens
