"""The families' real chat templates (Qwen 2.5/3/3-Coder, Llama 3.1/3.2/3.3, Phi-3.5,
gpt-oss, Mistral Nemo, Devstral, Gemma 3) render requests byte for byte as transformers'
apply_chat_template renders the same conversations.

tests/data/templates/expected.json was written by scripts/make_template_fixtures.py
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

from ds4d.api import anthropic_messages, openai_chat
from ds4d.chat.render import TemplateTraits, render_request, short_call_id, template_traits
from ds4d.chat.template import ChatTemplate, TemplateError
from ds4d.chat.types import ChatRequest, Message, Sampling, ToolCall

DATA = Path(__file__).parent / "data" / "templates"
EXPECTED = json.loads((DATA / "expected.json").read_text())
NOW = datetime.fromisoformat(EXPECTED["now"])
PARSERS = {"openai": openai_chat.parse, "anthropic": anthropic_messages.parse}


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


def test_alternating_templates_get_consecutive_user_turns_merged() -> None:
    request = ChatRequest([Message("user", "first"), Message("user", "second")])
    gemma = render_request(family_template("google-gemma-3-it"), request)
    assert "<start_of_turn>user\nfirst\n\nsecond<end_of_turn>" in gemma
    nemo = render_request(family_template("mistralai-Mistral-Nemo-Instruct-2407"), request)
    assert nemo == "<s>[INST]first\n\nsecond[/INST]"


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
