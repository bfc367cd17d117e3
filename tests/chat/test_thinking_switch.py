"""One thinking switch, every convention: each protocol's way of turning thinking off (or
on) renders the kit families' own templates exactly as transformers renders them with the
template's keyword (tests/data/templates/thinking.json, scripts/fixtures/make_thinking_fixtures.py):
for Qwen3 and Qwen3-MoE the empty `<think>\\n\\n</think>\\n\\n` when off."""

from __future__ import annotations

import json
from collections.abc import Callable
from datetime import datetime
from functools import cache
from pathlib import Path
from typing import Any

import pytest

from ds4d.api import anthropic_messages, ollama, openai_chat
from ds4d.api.common import ApiError
from ds4d.chat.render import render_request
from ds4d.chat.template import ChatTemplate
from ds4d.chat.types import ChatRequest, Sampling
from ds4d.engine.gguf_file import GGUFFile
from tests.helpers.kit import kit_model

DATA = Path(__file__).parent.parent / "data" / "templates"
FIXTURE = json.loads((DATA / "thinking.json").read_text())
NOW = datetime.fromisoformat(FIXTURE["now"])
MESSAGES: list[dict[str, Any]] = FIXTURE["messages"]
FAMILIES = sorted(FIXTURE["families"])


@cache
def kit_template(family: str) -> ChatTemplate:
    spec = FIXTURE["families"][family]
    source = GGUFFile(kit_model(family)).chat_template
    assert source
    return ChatTemplate(source, spec["bos"], spec["eos"], clock=lambda: NOW)


def _anthropic(thinking: dict[str, Any]) -> ChatRequest:
    body = {
        "max_tokens": 64,
        "system": MESSAGES[0]["content"],
        "messages": MESSAGES[1:],
        "thinking": thinking,
    }
    return anthropic_messages.parse(body, Sampling())


def _openai(**fields: Any) -> ChatRequest:
    return openai_chat.parse({"messages": MESSAGES, **fields}, Sampling())


def _kwargs(family: str, switch: str) -> dict[str, Any]:
    kwargs: dict[str, Any] = FIXTURE["families"][family]["kwargs"][switch]
    return kwargs


def _ollama(think: Any) -> ChatRequest:
    return ollama.parse_chat(
        {"model": "m", "messages": MESSAGES, "think": think}, Sampling()
    ).request


# chat_template_kwargs: the family's own keyword, as a transformers user passes it
OFF: dict[str, Callable[[str], ChatRequest]] = {
    "chat_template_kwargs": lambda f: _openai(chat_template_kwargs=_kwargs(f, "off")),
    "enable_thinking_false": lambda f: _openai(chat_template_kwargs={"enable_thinking": False}),
    "reasoning_effort_none": lambda f: _openai(reasoning_effort="none"),
    "anthropic_disabled": lambda f: _anthropic({"type": "disabled"}),
    "ollama_think_false": lambda f: _ollama(False),
}
ON: dict[str, Callable[[str], ChatRequest]] = {
    "chat_template_kwargs": lambda f: _openai(chat_template_kwargs=_kwargs(f, "on")),
    "reasoning_effort_high": lambda f: _openai(reasoning_effort="high"),
    "ollama_think_high": lambda f: _ollama("high"),
}


def test_the_fixture_covers_every_kit_family_whose_template_reads_a_switch() -> None:
    assert FAMILIES == ["gpt-oss", "gpt-oss-mxfp4", "qwen3", "qwen3moe"]
    for family in ("qwen3", "qwen3moe"):
        assert FIXTURE["families"][family]["renders"]["off"].endswith(
            "<|im_start|>assistant\n<think>\n\n</think>\n\n"
        )


@pytest.mark.parametrize("convention", sorted(OFF))
@pytest.mark.parametrize("family", FAMILIES)
def test_thinking_off_renders_as_transformers(family: str, convention: str) -> None:
    expected = FIXTURE["families"][family]["renders"]["off"]
    assert render_request(kit_template(family), OFF[convention](family)) == expected


@pytest.mark.parametrize("convention", sorted(ON))
@pytest.mark.parametrize("family", FAMILIES)
def test_thinking_on_renders_as_transformers(family: str, convention: str) -> None:
    expected = FIXTURE["families"][family]["renders"]["on"]
    assert render_request(kit_template(family), ON[convention](family)) == expected


def test_template_kwargs_reach_a_template_that_reads_them() -> None:
    template = ChatTemplate(
        "{{ messages[0]['content'] }}|{{ custom_flag }}|{{ messages | length }}|"
        "{{ add_generation_prompt }}"
    )
    req = _openai(
        chat_template_kwargs={"custom_flag": "yes", "messages": [], "add_generation_prompt": 0}
    )
    # the template's own variables are passed; the renderer's context is never replaced
    assert render_request(template, req) == "Answer with a number.|yes|2|True"


@pytest.mark.parametrize("value", [[], "x", {"enable_thinking": "no"}, {"enable_thinking": 0}])
def test_bad_chat_template_kwargs_are_a_400(value: Any) -> None:
    with pytest.raises(ApiError) as e:
        _openai(chat_template_kwargs=value)
    assert e.value.status == 400
    assert "chat_template_kwargs" in e.value.message


@pytest.mark.parametrize("think", ["max", 1, {"type": "disabled"}])
def test_bad_ollama_think_is_a_400(think: Any) -> None:
    with pytest.raises(ApiError) as e:
        _ollama(think)
    assert e.value.status == 400 and "think" in e.value.message
