"""Shared by the forced-tool-call tests of every call syntax (Hermes, DSML): the tools
offered, a driver that plays a model picking random allowed tokens, and the check of a
forced get_weather call's arguments."""

from __future__ import annotations

import random
from collections.abc import Generator, Sequence

import numpy as np

from ds4d.chat.constrain import Allow, Force
from ds4d.chat.types import Tool

WEATHER = Tool(
    "get_weather",
    "Weather for a city",
    {
        "type": "object",
        "properties": {
            "city": {"type": "string"},
            "days": {"type": "integer"},
            "metric": {"type": "boolean"},
            "unit": {"type": "string", "enum": ["c", "f", "celsius"]},
            "note": {"type": "string"},
            "tags": {"type": "array", "items": {"type": "string"}},
            "where": {
                "type": "object",
                "properties": {"lat": {"type": "number"}},
                "required": ["lat"],
            },
        },
        "required": ["city", "days", "metric", "unit", "tags", "where"],
    },
)
TOOLS = [
    WEATHER,
    Tool("get_time", "Current time", {"type": "object", "properties": {}}),
    Tool("get", "A prefix of the others' names", {}),
]
TOOL_NAMES = {t.name for t in TOOLS}


def run_constraint(gen: Generator, vocab: Sequence[str | None], rng: random.Random) -> str:
    """The text a constraint makes a model write when it picks allowed tokens at random."""
    text, step = "", next(gen)
    try:
        while True:
            if isinstance(step, Force):
                text += step.text
                step = gen.send("")
            else:
                assert isinstance(step, Allow) and step.ids.size > 0
                assert step.ids.dtype == np.int64
                tok = vocab[int(rng.choice(list(step.ids)))]
                text += tok
                step = gen.send(tok)
    except StopIteration:
        pass
    return text


def check_weather_args(args: dict) -> None:
    """Every required key is there with a value of its schema's type."""
    assert set(args) == {"city", "days", "metric", "unit", "tags", "where"}
    assert isinstance(args["city"], str) and args["city"]
    assert isinstance(args["days"], int) and not isinstance(args["days"], bool)
    assert isinstance(args["metric"], bool)
    assert args["unit"] in ("c", "f", "celsius")
    assert isinstance(args["tags"], list)
    assert isinstance(args["where"]["lat"], int | float)
