"""The families' real chat templates (Qwen 2.5/3/3-Coder, Llama 3.1/3.2/3.3, Phi-3.5,
gpt-oss, Mistral Nemo, Devstral, Gemma 3) render requests byte for byte as transformers'
apply_chat_template renders the same conversations.

tests/data/templates/expected.json was written by scripts/fixtures/make_template_fixtures.py
with transformers; here each request body goes through ds4d's own API parser and
`render_request`, as in serving.
"""

from __future__ import annotations

import json
from datetime import datetime
from functools import cache
from pathlib import Path
from typing import Any

import pytest

from ds4d.api import anthropic_messages, openai_chat, openai_responses
from ds4d.chat.render import TemplateTraits, render_request, short_call_id, template_traits
from ds4d.chat.template import ChatTemplate, TemplateError
from ds4d.chat.types import ChatRequest, Message, Sampling, ToolCall

DATA = Path(__file__).parents[1] / "data" / "templates"
EXPECTED = json.loads((DATA / "expected.json").read_text())
NOW = datetime.fromisoformat(EXPECTED["now"])
PARSERS = {
    "openai": openai_chat.parse,
    "anthropic": anthropic_messages.parse,
    "responses": openai_responses.parse,
}


@cache
def family_template(name: str) -> ChatTemplate:
    tokens = EXPECTED["templates"][name]
    return ChatTemplate(
        (DATA / f"{name}.jinja").read_text(), tokens["bos"], tokens["eos"], clock=lambda: NOW
    )


def parsed(case: str) -> ChatRequest:
    spec = EXPECTED["cases"][case]
    return PARSERS[spec["api"]](spec["body"], Sampling())


def _render_id(r: dict[str, Any]) -> str:
    return f"{r['template']}-{r['case']}-{'gen' if r['add_generation_prompt'] else 'nogen'}"


def test_fixtures_cover_every_template_with_enough_conversations() -> None:
    per_template: dict[str, set[str]] = {}
    for r in EXPECTED["renders"]:
        if "text" in r:
            per_template.setdefault(r["template"], set()).add(r["case"])
    assert set(per_template) == set(EXPECTED["templates"])
    assert len(per_template) == 11
    assert all(len(cases) >= 5 for cases in per_template.values()), per_template


@pytest.mark.parametrize("expected", EXPECTED["renders"], ids=_render_id)
def test_renders_as_transformers_does(expected: dict[str, Any]) -> None:
    template = family_template(expected["template"])
    request = parsed(expected["case"])
    gen = expected["add_generation_prompt"]
    if "error" in expected:
        with pytest.raises(TemplateError):
            render_request(template, request, add_generation_prompt=gen)
        return
    assert render_request(template, request, add_generation_prompt=gen) == expected["text"]


TRAITS = {
    "Qwen-Qwen2.5-7B-Instruct": TemplateTraits(native_tools=True),
    "Qwen-Qwen3-0.6B": TemplateTraits(native_tools=True, string_arguments=True),
    "Qwen3-Coder": TemplateTraits(native_tools=True),
    "meta-llama-Llama-3.1-8B-Instruct": TemplateTraits(
        native_tools=True, one_call_per_message=True
    ),
    "meta-llama-Llama-3.2-3B-Instruct": TemplateTraits(
        native_tools=True, one_call_per_message=True
    ),
    "meta-llama-Llama-3.3-70B-Instruct": TemplateTraits(
        native_tools=True, one_call_per_message=True
    ),
    "microsoft-Phi-3.5-mini-instruct": TemplateTraits(),
    "openai-gpt-oss-120b": TemplateTraits(
        native_tools=True, one_call_per_message=True, no_text_with_reasoning_on_calls=True
    ),
    "mistralai-Mistral-Nemo-Instruct-2407": TemplateTraits(
        native_tools=True, short_call_ids=True, alternating=True
    ),
    "unsloth-mistral-Devstral-Small-2507": TemplateTraits(native_tools=True, string_arguments=True),
    "google-gemma-3-it": TemplateTraits(alternating=True),
}


@pytest.mark.parametrize("name", sorted(TRAITS))
def test_probes_find_each_templates_conventions(name: str) -> None:
    assert template_traits(family_template(name)) == TRAITS[name]


def test_short_call_ids_are_stable_and_shared_by_call_and_result() -> None:
    assert short_call_id("a1B2c3D4e") == "a1B2c3D4e"
    long_id = "toolu_01XyZabcdefghijklmnop"
    short = short_call_id(long_id)
    assert len(short) == 9 and short.isalnum() and short == short_call_id(long_id)
    assert short != short_call_id(long_id + "x")
    nemo = family_template("mistralai-Mistral-Nemo-Instruct-2407")
    request = ChatRequest(
        [
            Message("user", "x"),
            Message("assistant", tool_calls=[ToolCall(long_id, "ls", '{"path": "/"}')]),
            Message("tool", "etc", tool_call_id=long_id),
        ]
    )
    text = render_request(nemo, request)
    assert text.count(f'"{short}"') == 2 and long_id not in text


def test_gpt_oss_takes_text_and_reasoning_before_a_call_as_one_analysis() -> None:
    # The template refuses both on one call message; the two become the analysis text.
    template = family_template("openai-gpt-oss-120b")
    request = ChatRequest(
        [
            Message("user", "x"),
            Message(
                "assistant",
                "I will look.",
                "Need the listing.",
                [ToolCall("c1", "ls", '{"path": "/"}')],
            ),
            Message("tool", "etc", tool_call_id="c1"),
        ]
    )
    assert (
        "<|channel|>analysis<|message|>Need the listing.\n\nI will look.<|end|>"
        in render_request(template, request)
    )


def test_alternating_templates_get_consecutive_same_role_turns_merged() -> None:
    request = ChatRequest([Message("user", "first"), Message("user", "second")])
    gemma = render_request(family_template("google-gemma-3-it"), request)
    assert "<start_of_turn>user\nfirst\n\nsecond<end_of_turn>" in gemma
    nemo = render_request(family_template("mistralai-Mistral-Nemo-Instruct-2407"), request)
    assert nemo == "<s>[INST]first\n\nsecond[/INST]"
    # Two assistant messages in a row (a Responses client replaying two output items).
    request = ChatRequest(
        [
            Message("user", "q"),
            Message("assistant", "part one", "think one"),
            Message("assistant", "part two", "think two"),
            Message("user", "next"),
        ]
    )
    gemma = render_request(family_template("google-gemma-3-it"), request)
    assert "<start_of_turn>model\npart one\n\npart two<end_of_turn>" in gemma
    nemo = render_request(family_template("mistralai-Mistral-Nemo-Instruct-2407"), request)
    assert nemo == "<s>[INST]q[/INST]part one\n\npart two</s>[INST]next[/INST]"


def test_results_follow_their_call_when_split_one_call_per_message() -> None:
    # Results arrive in the other order: each still follows its own call.
    llama = family_template("meta-llama-Llama-3.1-8B-Instruct")
    request = ChatRequest(
        [
            Message("user", "x"),
            Message(
                "assistant",
                tool_calls=[
                    ToolCall("c1", "ls", '{"path": "a"}'),
                    ToolCall("c2", "ls", '{"path": "b"}'),
                ],
            ),
            Message("tool", "result b", tool_call_id="c2"),
            Message("tool", "result a", tool_call_id="c1"),
        ]
    )
    text = render_request(llama, request)
    a, b = text.index('"path": "a"'), text.index('"path": "b"')
    assert a < text.index('"result a"') < b < text.index('"result b"')


def test_reasoning_effort_reaches_templates_that_read_it() -> None:
    template = family_template("openai-gpt-oss-120b")

    def effort_line(**kwargs: Any) -> str:
        text = render_request(template, ChatRequest([Message("user", "x")], **kwargs))
        return next(line for line in text.splitlines() if line.startswith("Reasoning:"))

    assert effort_line() == "Reasoning: medium"  # the template's default
    assert effort_line(reasoning_effort="max") == "Reasoning: high"
    assert effort_line(reasoning_effort="minimal") == "Reasoning: low"
    assert effort_line(thinking=False) == "Reasoning: low"
    assert effort_line(thinking=True) == "Reasoning: medium"


# ---- prefix reuse: what a later turn keeps of the earlier prompt ----------------------

# Templates whose next-turn prompt does NOT start with the previous prompt: Mistral Nemo
# puts the system prompt and the tool list in front of the *last* user turn, so both
# move every turn.
MOVES_SYSTEM_TO_LAST_TURN = {"mistralai-Mistral-Nemo-Instruct-2407"}


def _turns(system: str, tools: list[dict[str, Any]] | None) -> tuple[ChatRequest, ChatRequest]:
    first = [{"role": "user", "content": "List /tmp"}]
    if system:
        first.insert(0, {"role": "system", "content": system})
    second = [
        *first,
        {"role": "assistant", "content": "Sure."},
        {"role": "user", "content": "And /var?"},
    ]
    body: dict[str, Any] = {"tools": tools} if tools else {}
    return (
        openai_chat.parse({**body, "messages": first}, Sampling()),
        openai_chat.parse({**body, "messages": second}, Sampling()),
    )


@pytest.mark.parametrize("name", sorted(EXPECTED["templates"]))
def test_next_turn_starts_with_the_previous_prompt(name: str) -> None:
    template = family_template(name)
    tools = EXPECTED["cases"]["tools_offered"]["body"]["tools"]
    p1, p2 = (render_request(template, r) for r in _turns("Be brief.", tools))
    assert p2.startswith(p1) == (name not in MOVES_SYSTEM_TO_LAST_TURN)
    # Without a system prompt or tools, every one of these templates extends the prefix.
    p1, p2 = (render_request(template, r) for r in _turns("", None))
    assert p2.startswith(p1)
    # The same history always renders the same bytes (a fresh template, a fresh parse).
    fresh = ChatTemplate(template.source, template.bos_token, template.eos_token, clock=lambda: NOW)
    assert render_request(fresh, _turns("", None)[1]) == p2


def test_qwen3_drops_earlier_reasoning_but_keeps_it_inside_a_tool_loop() -> None:
    qwen3 = family_template("Qwen-Qwen3-0.6B")
    user = {"role": "user", "content": "What is in /tmp?"}
    call = {
        "id": "c1",
        "type": "function",
        "function": {"name": "ls", "arguments": '{"path": "/tmp"}'},
    }
    thought = {
        "role": "assistant",
        "reasoning_content": "List it.",
        "content": "",
        "tool_calls": [call],
    }
    result = {"role": "tool", "tool_call_id": "c1", "content": "a.txt"}
    generated = '<think>\nList it.\n</think>\n\n<tool_call>\n{"name": "ls", "arguments": '
    p1 = render_request(qwen3, openai_chat.parse({"messages": [user]}, Sampling()))
    # Inside the tool loop (no user turn since), the reasoning stays: the prefix holds.
    p2 = render_request(qwen3, openai_chat.parse({"messages": [user, thought, result]}, Sampling()))
    assert p2.startswith(p1 + generated)
    # After the next user turn, that reasoning is dropped from history: the prompt
    # diverges right after the assistant header of the earlier turn.
    answer = {"role": "assistant", "reasoning_content": "Report.", "content": "Only a.txt."}
    p3 = render_request(
        qwen3,
        openai_chat.parse(
            {"messages": [user, thought, result, answer, {"role": "user", "content": "Thanks"}]},
            Sampling(),
        ),
    )
    assert p3.startswith(p1) and not p3.startswith(p1 + "<think>")
    # With thinking off the generation prompt carries an empty think block, which the
    # next turn's history does not repeat.
    off = render_request(qwen3, ChatRequest([Message("user", "x")], thinking=False))
    assert off.endswith("<|im_start|>assistant\n<think>\n\n</think>\n\n")
    nxt = render_request(
        qwen3,
        ChatRequest(
            [Message("user", "x"), Message("assistant", "y"), Message("user", "z")], thinking=False
        ),
    )
    assert not nxt.startswith(off)


def test_gpt_oss_drops_analysis_of_finished_turns() -> None:
    gpt_oss = family_template("openai-gpt-oss-120b")
    history = [Message("user", "x"), Message("assistant", "y", reasoning="think y")]
    p1 = render_request(gpt_oss, ChatRequest(history[:1]))
    p2 = render_request(gpt_oss, ChatRequest([*history, Message("user", "z")]))
    assert p2.startswith(p1 + "<|channel|>final<|message|>y<|end|>")
    assert "think y" not in p2


@pytest.mark.parametrize("name", sorted(EXPECTED["templates"]))
def test_tool_loop_turn_starts_with_the_previous_prompt(name: str) -> None:
    # The agent case: the call and its result come back, no new user turn.
    template = family_template(name)
    tools = EXPECTED["cases"]["tools_offered"]["body"]["tools"]
    call = {
        "id": "call_1",
        "type": "function",
        "function": {"name": "ls", "arguments": '{"path": "/tmp"}'},
    }
    first = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "List /tmp"}]
    loop = [
        *first,
        {"role": "assistant", "content": "", "tool_calls": [call]},
        {"role": "tool", "tool_call_id": "call_1", "content": "a.txt"},
    ]
    p1, p2 = (
        render_request(template, openai_chat.parse({"tools": tools, "messages": m}, Sampling()))
        for m in (first, loop)
    )
    # Nemo writes the system prompt into the last user turn only while it is the last
    # message: once the call follows, the system text leaves the prompt.
    assert p2.startswith(p1) == (name not in MOVES_SYSTEM_TO_LAST_TURN)
    p1, p2 = (
        render_request(template, openai_chat.parse({"tools": tools, "messages": m[1:]}, Sampling()))
        for m in (first, loop)
    )
    assert p2.startswith(p1)
