"""Forced DSML tool calls: whatever the model picks among the allowed tokens, the block
parses (whole and streamed), names an offered tool and carries the schema's required
keys with JSON-valid values."""

from __future__ import annotations

import json
import random

from ds4d.chat.constrain import VocabIndex
from ds4d.chat.deepseek4 import ThinkMode
from ds4d.chat.deepseek4_forced import DSMLVocab, forced_dsml_call
from ds4d.chat.deepseek4_output import DS4Decode
from ds4d.chat.types import ChatRequest, Message, ToolCallEnd, ToolCallStart, ToolChoice
from tests.helpers.forced_calls import TOOL_NAMES, TOOLS, check_weather_args, run_constraint

# Single characters, fragments holding markup and escapes, digits, and unusable tokens.
VOCAB = (
    [chr(c) for c in range(32, 127)]
    + [
        "\n",
        "\t",
        "</",
        "<｜",
        "&lt;",
        '",',
        '"}',
        "\\n",
        " Paris",
        "get",
        "_weather",
        "true",
        "false",
        "tr",
        "fa",
        "00",
        "12",
        "0",
        "\ufffd",
        "é",
        "ab",
        "<br>",
    ]
    + [None, None]
)


def drive(choice: ToolChoice, rng: random.Random, close_thinking: bool = False) -> str:
    gen = forced_dsml_call(
        DSMLVocab(VocabIndex(VOCAB)), TOOLS, choice, close_thinking=close_thinking
    )
    return run_constraint(gen, VOCAB, rng)


def parse(text: str, thinking: bool = False, pieces: int = 1):
    request = ChatRequest([Message("user", "x")], tools=TOOLS, tool_choice=ToolChoice("required"))
    decode = DS4Decode(request, ThinkMode.HIGH if thinking else ThinkMode.NONE)
    events = []
    size = max(1, len(text) // pieces)
    for i in range(0, len(text), size):
        events += decode.feed(text[i : i + size])
        if decode.tool_block_closed:
            assert text[i + size :] == ""  # the block's end tag ends the generation
    assert decode.tool_block_closed, text
    events += decode.flush()
    (start,) = [e for e in events if isinstance(e, ToolCallStart)]
    (end,) = [e for e in events if isinstance(e, ToolCallEnd)]
    assert decode.replay == {start.id: text[text.index("\n\n") :]}  # exact block remembered
    return start.name, json.loads(end.arguments)


def test_named_call_always_parses_with_its_required_keys():
    for seed in range(150):
        text = drive(ToolChoice("named", "get_weather"), random.Random(seed))
        name, args = parse(text, pieces=1 + seed % 7)
        assert name == "get_weather"
        check_weather_args(args)


def test_required_picks_one_of_the_offered_tools():
    seen = set()
    for seed in range(60):
        name, args = parse(drive(ToolChoice("required"), random.Random(seed)))
        assert name in TOOL_NAMES
        seen.add(name)
        if name != "get_weather":
            assert args == {}
    assert len(seen) >= 2  # the model's choice matters


def test_thinking_mode_closes_the_reasoning_first():
    text = drive(ToolChoice("named", "get_time"), random.Random(1), close_thinking=True)
    assert text.startswith("</think>\n\n<｜DSML｜tool_calls>")
    assert parse(text, thinking=True) == ("get_time", {})
