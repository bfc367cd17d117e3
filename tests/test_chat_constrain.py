"""Forced tool calls: whatever the model picks among the allowed tokens, the block parses
and carries the schema's required keys."""

from __future__ import annotations

import json
import random

from ds4d.chat.constrain import Force, VocabIndex, forced_tool_call
from ds4d.chat.stream import OutputParser
from ds4d.chat.types import Tool, ToolCallEnd, ToolCallStart, ToolChoice
from tests.forced_calls import TOOL_NAMES, TOOLS, check_weather_args, run_constraint

# A byte-BPE-like vocabulary: single characters, common fragments with quotes and
# backslashes in them, digits, and tokens that are None (specials / partial UTF-8).
VOCAB = (
    [chr(c) for c in range(32, 127)]
    + ["\n", "\t", '",', '":', '"}', "\\n", "get", "_weather", "weather", "city", " Paris",
       "true", "false", "tr", "ue", "fa", "lse", "00", "12", "0", "007", "\ufffd", "é", "ab"]
    + [None, None]
)

def drive(choice: ToolChoice, rng: random.Random) -> str:
    return run_constraint(forced_tool_call(VocabIndex(VOCAB), TOOLS, choice), VOCAB, rng)


def parse(text: str):
    p = OutputParser(tools=True)
    events = p.feed(text) + p.flush()
    starts = [e for e in events if isinstance(e, ToolCallStart)]
    ends = [e for e in events if isinstance(e, ToolCallEnd)]
    assert len(starts) == 1, text
    return starts[0].name, json.loads(ends[0].arguments)


def test_named_call_always_valid():
    for seed in range(200):
        text = drive(ToolChoice("named", "get_weather"), random.Random(seed))
        name, args = parse(text)
        assert name == "get_weather"
        check_weather_args(args)


def test_required_picks_one_of_the_offered_tools():
    seen = set()
    for seed in range(100):
        name, args = parse(drive(ToolChoice("required"), random.Random(seed)))
        assert name in TOOL_NAMES
        seen.add(name)
        if name == "get_time":
            assert args == {}
    assert len(seen) >= 2  # the model's choice matters


def test_prefix_ids_only_spell_prefixes():
    vocab = VocabIndex(VOCAB)
    ids = vocab.prefix_ids(["true", "false"])
    assert {VOCAB[i] for i in ids} == {"t", "tr", "true", "f", "fa", "false"}


def test_a_vocabulary_without_digits_or_plain_text_still_gives_valid_json():
    vocab = VocabIndex(["\\", "\x01", None])  # nothing usable inside a value
    tool = Tool("f", "", {"type": "object", "required": ["city", "days"], "properties": {
        "city": {"type": "string"}, "days": {"type": "integer"}}})
    gen = forced_tool_call(vocab, [tool], ToolChoice("required"))
    text, step = "", next(gen)
    try:
        while True:
            assert isinstance(step, Force)  # nothing left to choose
            text += step.text
            step = gen.send("")
    except StopIteration:
        pass
    name, args = parse(text)
    assert name == "f" and args == {"city": "", "days": 0}
