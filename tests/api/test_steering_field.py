"""The `steering` extension field in every protocol's request: one shape for OpenAI chat,
completions and Responses, Anthropic messages, llama.cpp's /infill and Ollama's options;
whatever is malformed is a 400 naming the field (whether the name exists is the model's
to say: tests/serving/test_steering.py, tests/e2e/test_e2e_steering.py)."""

from __future__ import annotations

from typing import Any

import pytest

from ds4d.api import (
    anthropic_messages,
    infill,
    ollama,
    openai_chat,
    openai_completions,
    openai_responses,
)
from ds4d.api.common import ApiError
from ds4d.chat.types import ChatRequest, Sampling, SteeringChoice

USER = [{"role": "user", "content": "hi"}]


BODIES: dict[str, tuple[Any, dict[str, Any]]] = {
    "chat": (openai_chat.parse, {"messages": USER}),
    "completions": (openai_completions.parse, {"prompt": "hi"}),
    "responses": (openai_responses.parse, {"input": "hi"}),
    "messages": (anthropic_messages.parse, {"messages": USER, "max_tokens": 4}),
    "infill": (infill.parse, {"input_prefix": "a", "input_suffix": "b"}),
}


def parsed(name: str, steering: Any) -> ChatRequest:
    parse, body = BODIES[name]
    req: ChatRequest = parse({**body, "steering": steering}, Sampling())
    return req


def parsers(steering: Any) -> dict[str, ChatRequest]:
    """Each protocol's request carrying `steering` where that protocol puts it."""
    options = {"options": {"steering": steering}}
    return {
        **{name: parsed(name, steering) for name in BODIES},
        "ollama chat": ollama.parse_chat({"messages": USER, **options}, Sampling()).request,
        "ollama generate": ollama.parse_generate({"prompt": "hi", **options}, Sampling()).request,
    }


def test_every_protocol_reads_the_same_field():
    full = {"name": "terse", "scale": -0.5, "attn": 0.25, "ffn": 2, "layers": [4, 12]}
    for name, req in parsers(full).items():
        assert req.steering == SteeringChoice("terse", -0.5, 0.25, 2.0, (4, 12)), name
    for name, req in parsers("terse").items():
        assert req.steering == SteeringChoice("terse"), name
    for name, req in parsers(None).items():
        assert req.steering is None, name


@pytest.mark.parametrize(
    ("steering", "param"),
    [
        (3, "steering"),
        (["terse"], "steering"),
        ("", "steering.name"),
        ({"scale": 1}, "steering.name"),
        ({"name": 1}, "steering.name"),
        ({"name": "t", "scale": "big"}, "steering.scale"),
        ({"name": "t", "scale": True}, "steering.scale"),
        ({"name": "t", "attn": 101}, "steering.attn"),
        ({"name": "t", "ffn": float("nan")}, "steering.ffn"),
        ({"name": "t", "layers": [5, 2]}, "steering.layers"),
        ({"name": "t", "layers": [-1, 2]}, "steering.layers"),
        ({"name": "t", "layers": [1, 2, 3]}, "steering.layers"),
        ({"name": "t", "layers": [1, True]}, "steering.layers"),
        ({"name": "t", "layers": "1:2"}, "steering.layers"),
        ({"name": "t", "file": "/etc/passwd"}, "steering.file"),
    ],
)
def test_malformed_steering_is_a_400_naming_the_field(steering, param):
    for name in BODIES:
        with pytest.raises(ApiError) as e:
            parsed(name, steering)
        assert (e.value.status, e.value.param) == (400, param), name
    with pytest.raises(ApiError) as e:
        ollama.parse_chat({"messages": USER, "options": {"steering": steering}}, Sampling())
    assert (e.value.status, e.value.param) == (400, "options." + param)
