"""Forced tool calls: whatever the model picks among the allowed tokens, the block parses
and carries the schema's required keys."""

from __future__ import annotations

import json
import random
from pathlib import Path

import pytest

from ds4d.chat.constrain import Force, VocabIndex, forced_tool_call
from ds4d.chat.formats import TemplateChatFormat
from ds4d.chat.stream import OutputParser
from ds4d.chat.template import ChatTemplate
from ds4d.chat.types import (
    ChatRequest,
    Message,
    TextDelta,
    Tool,
    ToolCallEnd,
    ToolCallStart,
    ToolChoice,
)
from tests.helpers.forced_calls import TOOL_NAMES, TOOLS, check_weather_args, run_constraint

# A byte-BPE-like vocabulary: single characters, common fragments with quotes and
# backslashes in them, digits, and tokens that are None (specials / partial UTF-8).
VOCAB = (
    [chr(c) for c in range(32, 127)]
    + [
        "\n",
        "\t",
        '",',
        '":',
        '"}',
        "\\n",
        "get",
        "_weather",
        "weather",
        "city",
        " Paris",
        "true",
        "false",
        "tr",
        "ue",
        "fa",
        "lse",
        "00",
        "12",
        "0",
        "007",
        "\ufffd",
        "é",
        "ab",
    ]
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
    tool = Tool(
        "f",
        "",
        {
            "type": "object",
            "required": ["city", "days"],
            "properties": {"city": {"type": "string"}, "days": {"type": "integer"}},
        },
    )
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


# ---- every family's syntax, with the embedded model's real vocabulary -------------------

FAMILY_TEMPLATES = {
    "hermes": "Qwen-Qwen2.5-7B-Instruct.jinja",
    "qwen3-coder-xml": "Qwen3-Coder.jinja",
    "llama-json": "meta-llama-Llama-3.1-8B-Instruct.jinja",
    "mistral-json": "mistralai-Mistral-Nemo-Instruct-2407.jinja",
    "mistral-args": "unsloth-mistral-Devstral-Small-2507.jinja",
    "harmony": "openai-gpt-oss-120b.jinja",
}
# What a model typically writes on its own before the call's first choice: the opening
# marker (the constraint takes over from there).
OPENINGS = {
    "hermes": ["<tool_call>", "<tool_call>\n"],
    "qwen3-coder-xml": ["<tool_call>", "<tool_call>\n<function="],
    "llama-json": ['{"name": "'],
    "mistral-json": ["[TOOL_CALLS]", "[TOOL_CALLS]["],
    "mistral-args": ["[TOOL_CALLS]"],
    "harmony": ["<|channel|>commentary to=functions.", " to=functions."],
}


@pytest.fixture(scope="module")
def real_vocab(engine) -> VocabIndex:
    return VocabIndex.from_tokenizer(engine.tokenizer)


def family(syntax: str) -> TemplateChatFormat:
    source = Path(__file__).parents[1] / "data" / "templates" / FAMILY_TEMPLATES[syntax]
    fmt = TemplateChatFormat(ChatTemplate(source.read_text()))
    assert fmt.syntax.name == syntax
    return fmt


def parse_calls(fmt: TemplateChatFormat, text: str, tools=TOOLS) -> list[tuple[str, dict]]:
    d = fmt.decode(ChatRequest([Message("user", "x")], tools=tools))
    events = d.feed(text) + d.flush()
    assert not [e for e in events if isinstance(e, TextDelta) and e.text.strip()], text
    assert d.malformed is None, (d.malformed, text)
    names = {e.index: e.name for e in events if isinstance(e, ToolCallStart)}
    return [(names[e.index], json.loads(e.arguments)) for e in events if isinstance(e, ToolCallEnd)]


@pytest.mark.parametrize("syntax", list(FAMILY_TEMPLATES))
def test_forced_call_in_each_syntax_parses_with_the_real_vocabulary(syntax, real_vocab):
    fmt = family(syntax)
    seen = set()
    for seed in range(25):
        choice = ToolChoice("named", "get_weather") if seed % 2 else ToolChoice("required")
        request = ChatRequest([Message("user", "x")], tools=TOOLS, tool_choice=choice)
        text = run_constraint(
            fmt.forced_call(real_vocab, request), real_vocab.texts, random.Random(seed)
        )
        [(name, args)] = parse_calls(fmt, text)
        assert name in TOOL_NAMES
        seen.add(name)
        if seed % 2:
            assert name == "get_weather"
        if name == "get_weather":
            check_weather_args(args)
    assert len(seen) >= 2


@pytest.mark.parametrize("syntax", list(FAMILY_TEMPLATES))
def test_forced_call_in_each_syntax_with_a_tiny_vocabulary(syntax):
    fmt = family(syntax)
    vocab = VocabIndex(VOCAB)
    for seed in range(40):
        request = ChatRequest(
            [Message("user", "x")], tools=TOOLS, tool_choice=ToolChoice("named", "get_weather")
        )
        text = run_constraint(fmt.forced_call(vocab, request), VOCAB, random.Random(seed))
        [(name, args)] = parse_calls(fmt, text)
        assert name == "get_weather"
        check_weather_args(args)


@pytest.mark.parametrize(
    ("syntax", "opening"), [(s, o) for s, opens in OPENINGS.items() for o in opens]
)
def test_a_call_the_model_opens_is_finished_as_a_valid_call(syntax, opening, real_vocab):
    """As the serving loop does: the decode sees the opening marker, hands out the
    constraint for the rest, and the whole text parses into a call of a declared tool."""
    fmt = family(syntax)
    for seed in range(10):
        d = fmt.decode(ChatRequest([Message("user", "x")], tools=TOOLS))
        events = d.feed(opening)
        assert d.call_opened
        step = d.constrain_call(real_vocab)
        assert step is not None and not d.call_opened
        rest = run_constraint(step, real_vocab.texts, random.Random(seed))
        events += d.feed(rest) + d.flush()
        assert d.malformed is None and d.tool_calls == 1, opening + rest
        assert not [e for e in events if isinstance(e, TextDelta)]
        end = next(e for e in events if isinstance(e, ToolCallEnd))
        name = next(e.name for e in events if isinstance(e, ToolCallStart))
        if name == "get_weather":
            check_weather_args(json.loads(end.arguments))


def test_a_call_opened_past_its_markup_is_left_to_the_parser(real_vocab):
    """The model already chose a name in the marker's piece: no constraint can replay
    that, and a malformed result is dropped, not shown."""
    fmt = family("hermes")
    d = fmt.decode(ChatRequest([Message("user", "x")], tools=TOOLS))
    d.feed('<tool_call>\n{"name": "rm_')
    assert d.call_opened and d.constrain_call(real_vocab) is None
    events = d.feed('rf", "arguments": {}}\n</tool_call>') + d.flush()
    assert events == [] and "undeclared tool 'rm_rf'" in d.malformed


def test_forced_call_closes_reasoning_the_prompt_opened():
    opened = "{{ '<|im_start|>assistant\\n<think>\\n' }}{# tools tool_call <tool_call> #}"
    fmt = TemplateChatFormat(ChatTemplate(opened))
    request = ChatRequest(
        [Message("user", "x")], tools=TOOLS, tool_choice=ToolChoice("named", "get_time")
    )
    text = run_constraint(fmt.forced_call(VocabIndex(VOCAB), request), VOCAB, random.Random(0))
    assert text.startswith("</think>\n\n<tool_call>")
    d = fmt.decode(request)
    events = d.feed(text) + d.flush()
    assert [e.name for e in events if isinstance(e, ToolCallStart)] == ["get_time"]
