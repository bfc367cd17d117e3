"""Every family's tool-call syntax, parsed while streaming: recorded-style and hostile
model outputs (tests/data/outputs/*.json), fed through the decode pipeline the real
family template selects, cut at every character boundary. Markup never reaches the text
channel, and every split yields the calls, text and reasoning of the whole-text parse."""

from __future__ import annotations

import json
import random
from pathlib import Path

import pytest

from ds4d.chat.formats import TemplateChatFormat, call_syntax_for
from ds4d.chat.template import ChatTemplate
from ds4d.chat.toolsyntax_harmony import HarmonySyntax
from ds4d.chat.toolsyntax_hermes import HermesSyntax
from ds4d.chat.toolsyntax_llama import LlamaSyntax
from ds4d.chat.toolsyntax_mistral import MistralSyntax
from ds4d.chat.toolsyntax_qwen_xml import QwenXMLSyntax
from ds4d.chat.types import (
    ChatRequest,
    Message,
    ReasoningDelta,
    TextDelta,
    Tool,
    ToolCallArgsDelta,
    ToolCallEnd,
    ToolCallStart,
)

DATA = Path(__file__).parents[1] / "data"
TEMPLATES = DATA / "templates"

TOOLS = [
    Tool(
        "get_weather",
        "Weather forecast for a city",
        {
            "type": "object",
            "properties": {
                "city": {"type": "string"},
                "days": {"type": "integer"},
                "metric": {"type": "boolean"},
            },
            "required": ["city"],
        },
    ),
    Tool(
        "run_shell",
        "Run a shell command",
        {
            "type": "object",
            "properties": {"command": {"type": "string"}},
            "required": ["command"],
        },
    ),
]

# Markup of every syntax: none of it may ever be sent as text.
MARKUP = (
    "<tool_call>",
    "</tool_call>",
    "<function=",
    "</function>",
    "</parameter>",
    "[TOOL_CALLS]",
    "[ARGS]",
    "[CALL_ID]",
    "<|python_tag|>",
    "<|channel|>",
    "<|message|>",
    "<|start|>",
    "<|end|>",
    "<|call|>",
    "<|return|>",
    "<|constrain|>",
    "<tool_response>",
    "</tool_response>",
)


def _load() -> list[tuple[str, str, dict]]:
    out = []
    for path in sorted((DATA / "outputs").glob("*.json")):
        spec = json.loads(path.read_text())
        out += [(path.stem, spec["template"], case) for case in spec["cases"]]
    return out


CASES = _load()
_FORMATS: dict[str, TemplateChatFormat] = {}


def chat_format(template: str) -> TemplateChatFormat:
    if template not in _FORMATS:
        _FORMATS[template] = TemplateChatFormat(ChatTemplate((TEMPLATES / template).read_text()))
    return _FORMATS[template]


def decode(template: str, case: dict):
    request = ChatRequest([Message("user", "What's the weather in Paris?")], tools=TOOLS)
    d = chat_format(template).decode(request)
    if case.get("in_reasoning"):  # a template whose generation prompt opens <think>
        d.parser.think.in_reasoning = True
    return d


def run(template: str, case: dict, cuts: list[int]) -> tuple[list, object]:
    d = decode(template, case)
    text, events, prev = case["text"], [], 0
    for c in [*cuts, len(text)]:
        events += d.feed(text[prev:c])
        prev = c
    return events + d.flush(), d


def summary(events: list) -> tuple[str, str, list]:
    text = "".join(e.text for e in events if isinstance(e, TextDelta))
    reasoning = "".join(e.text for e in events if isinstance(e, ReasoningDelta))
    starts = {e.index: e.name for e in events if isinstance(e, ToolCallStart)}
    args = {e.index: "" for e in events if isinstance(e, ToolCallStart)}
    for e in events:
        if isinstance(e, ToolCallArgsDelta):
            args[e.index] += e.text
    calls = []
    for e in events:
        if isinstance(e, ToolCallEnd):
            assert e.arguments == args[e.index]
            calls.append([starts[e.index], json.loads(e.arguments)])
    return text, reasoning, calls


def splits(n: int, seed: int) -> list[list[int]]:
    rng = random.Random(seed)
    out = [[i] for i in range(n + 1)]  # every single cut
    out.append(list(range(1, n)))  # one character at a time
    out += [sorted(rng.sample(range(1, n), min(n - 1, k))) for k in (2, 3, 5, 8) if n > 2]
    return out


@pytest.mark.parametrize(
    ("syntax", "template", "case"), CASES, ids=[f"{s}-{c['id']}" for s, _, c in CASES]
)
def test_every_split_gives_the_whole_text_parse_and_no_markup(syntax, template, case):
    whole, d = run(template, case, [])
    text, reasoning, calls = summary(whole)
    assert text == case["content"]
    assert reasoning == case["reasoning"]
    assert calls == case["calls"]
    assert (d.malformed is not None) == case["dropped"], d.malformed
    for cuts in splits(len(case["text"]), seed=len(case["text"])):
        events, _ = run(template, case, cuts)
        assert summary(events) == (text, reasoning, calls), cuts
        pieces = [e.text for e in events if isinstance(e, TextDelta)]
        for marker in MARKUP:
            assert all(marker not in p for p in pieces) and marker not in "".join(pieces)


@pytest.mark.parametrize(
    ("template", "syntax"),
    [
        ("Qwen-Qwen2.5-7B-Instruct.jinja", HermesSyntax),
        ("Qwen-Qwen3-0.6B.jinja", HermesSyntax),
        ("Qwen3-Coder.jinja", QwenXMLSyntax),
        ("meta-llama-Llama-3.1-8B-Instruct.jinja", LlamaSyntax),
        ("meta-llama-Llama-3.2-3B-Instruct.jinja", LlamaSyntax),
        ("meta-llama-Llama-3.3-70B-Instruct.jinja", LlamaSyntax),
        ("mistralai-Mistral-Nemo-Instruct-2407.jinja", MistralSyntax),
        ("unsloth-mistral-Devstral-Small-2507.jinja", MistralSyntax),
        ("openai-gpt-oss-120b.jinja", HarmonySyntax),
        ("microsoft-Phi-3.5-mini-instruct.jinja", HermesSyntax),  # no tools: ds4d's block
    ],
)
def test_syntax_is_chosen_from_the_template(template, syntax):
    chosen = call_syntax_for((TEMPLATES / template).read_text())
    assert type(chosen) is syntax
    if syntax is MistralSyntax:
        assert chosen.named == ("Devstral" in template)


def test_no_template_gets_hermes():
    assert type(call_syntax_for("")) is HermesSyntax


def test_ids_are_distinct_and_prefixed():
    request = ChatRequest([Message("user", "x")], tools=TOOLS, tool_id_prefix="toolu_")
    d = chat_format("Qwen3-Coder.jinja").decode(request)
    events = (
        d.feed(
            json.loads((DATA / "outputs" / "qwen3_coder_xml.json").read_text())["cases"][4]["text"]
        )
        + d.flush()
    )
    ids = [e.id for e in events if isinstance(e, ToolCallStart)]
    assert len(ids) == 2 and ids[0] != ids[1] and all(i.startswith("toolu_") for i in ids)
    assert [e.index for e in events if isinstance(e, ToolCallStart)] == [0, 1]


def test_without_active_tools_hermes_markup_is_text():
    request = ChatRequest([Message("user", "x")])
    d = chat_format("Qwen-Qwen3-0.6B.jinja").decode(request)
    text = '<tool_call>{"name": "f", "arguments": {}}</tool_call>'
    assert summary(d.feed(text) + d.flush())[0] == text


def test_harmony_splits_channels_without_tools():
    d = chat_format("openai-gpt-oss-120b.jinja").decode(ChatRequest([Message("user", "hi")]))
    events = (
        d.feed(
            "<|channel|>analysis<|message|>Greet.<|end|><|start|>assistant"
            "<|channel|>final<|message|>Hi!"
        )
        + d.flush()
    )
    assert summary(events) == ("Hi!", "Greet.", [])


def test_harmony_call_marker_ends_the_turn():
    d = chat_format("openai-gpt-oss-120b.jinja").decode(
        ChatRequest([Message("user", "x")], tools=TOOLS)
    )
    d.feed(
        '<|channel|>commentary to=functions.run_shell <|constrain|>json<|message|>{"command":"ls"}'
    )
    assert not d.tool_block_closed
    d.feed("<|call|>")
    assert d.tool_block_closed and d.tool_calls == 1


# ---- replay: the next turn's prompt holds the call exactly as the model sampled it ------

# The model's reply in a spelling the template would not write (compact JSON, `true`
# where the template prints Python's `True`): only exact replay keeps the prompt a
# prefix match of the KV.
REPLIES = [
    (
        "Qwen-Qwen2.5-7B-Instruct.jinja",
        '<tool_call>\n{"name": "get_weather", "arguments": {"city":"Paris","days":3}}\n'
        "</tool_call>",
    ),
    (
        "Qwen-Qwen3-0.6B.jinja",
        '<tool_call>\n{"name": "get_weather", "arguments": {"city":"Paris","days":3}}\n'
        "</tool_call>",
    ),
    (
        "Qwen-Qwen3-0.6B.jinja",  # reasoning before the call is rendered back too
        "<think>\nNeed the forecast.\n</think>\n\n"
        '<tool_call>\n{"name": "get_weather", "arguments": {"city":"Paris","days":3}}\n'
        "</tool_call>",
    ),
    (
        "Qwen3-Coder.jinja",
        "<tool_call>\n<function=get_weather>\n<parameter=city>\nParis\n</parameter>\n"
        "<parameter=metric>\ntrue\n</parameter>\n</function>\n</tool_call>",
    ),
    (
        "meta-llama-Llama-3.1-8B-Instruct.jinja",
        '{"name": "get_weather", "parameters": {"city":"Paris","days":3}}',
    ),
    (
        "unsloth-mistral-Devstral-Small-2507.jinja",
        '[TOOL_CALLS]get_weather[ARGS]{"city":"Paris","days":3}',
    ),
    (
        "openai-gpt-oss-120b.jinja",
        "<|channel|>commentary to=functions.get_weather <|constrain|>json<|message|>"
        '{"city":"Paris","days":3}',
    ),
    (
        "openai-gpt-oss-120b.jinja",  # the analysis before a call is kept by the template
        "<|channel|>analysis<|message|>Need the forecast.<|end|><|start|>assistant"
        "<|channel|>commentary to=functions.get_weather <|constrain|>json<|message|>"
        '{"city":"Paris","days":3}',
    ),
    (
        "microsoft-Phi-3.5-mini-instruct.jinja",  # no tools in the template: ds4d's Hermes
        '<tool_call>\n{"name": "get_weather", "arguments": {"city":"Paris","days":3}}\n'
        "</tool_call>",
    ),
]


def next_turn(template: str, reply: str, replay: bool) -> tuple[str, str]:
    """(first prompt + the reply as sampled, the second turn's prompt) through the real
    state service's tool memory, the client sending the call back re-serialized."""
    from ds4d.chat.types import ToolCall
    from ds4d.state.service import StateService

    fmt = TemplateChatFormat(ChatTemplate((TEMPLATES / template).read_text(), "<s>", "</s>"))
    service = StateService.create(
        tokenizer=None, fingerprint="t", ctx=4096, kv_dir=None, tool_replay=replay
    )
    first = ChatRequest([Message("user", "Weather in Paris?")], tools=TOOLS)
    prompt = fmt.render(service.prepare_request(first))
    d = fmt.decode(first)
    events = d.feed(reply) + d.flush()
    for call_id, record in d.replay.items():  # what the serving loop remembers
        service.tool_memory.remember(call_id, record)
    start = next(e for e in events if isinstance(e, ToolCallStart))
    end = next(e for e in events if isinstance(e, ToolCallEnd))
    resent = json.dumps(json.loads(end.arguments), indent=2, sort_keys=True)
    call = ToolCall(start.id, start.name, resent)
    text, reasoning, _ = summary(events)
    second = ChatRequest(
        [
            Message("user", "Weather in Paris?"),
            Message("assistant", text, reasoning=reasoning or None, tool_calls=[call]),
            Message("tool", "Sunny, 21 C", tool_call_id=call.id, name=call.name),
        ],
        tools=TOOLS,
    )
    return prompt + reply, fmt.render(service.prepare_request(second))


@pytest.mark.parametrize(("template", "reply"), REPLIES)
def test_next_turn_reuses_the_sampled_call(template, reply):
    kv, prompt = next_turn(template, reply, replay=True)
    assert prompt.startswith(kv)
    without, prompt = next_turn(template, reply, replay=False)
    assert not prompt.startswith(without)  # the template alone respells the call


def test_put_back_sampled_only_where_the_template_wrote_the_call():
    from ds4d.chat.formats import put_back_sampled

    prompt = 'A {"a": 1} B {"a": 1} C'
    assert put_back_sampled(prompt, [('{"a": 1}', '{"a":1}'), ('{"a": 1}', '{ "a":1 }')]) == (
        'A {"a":1} B { "a":1 } C'
    )
    assert put_back_sampled(prompt, [('{"b": 2}', "x")]) == prompt


def test_harmony_return_ends_the_reply_without_a_call():
    d = chat_format("openai-gpt-oss-120b.jinja").decode(
        ChatRequest([Message("user", "x")], tools=TOOLS)
    )
    events = d.feed("<|channel|>final<|message|>Done.")
    assert not d.stopped
    events += d.feed("<|return|>") + d.flush()
    assert d.stopped and not d.tool_block_closed and d.tool_calls == 0
    assert summary(events) == ("Done.", "", [])


@pytest.mark.parametrize("template", ["Qwen-Qwen3-0.6B.jinja", "Qwen3-Coder.jinja"])
def test_a_tool_result_the_model_writes_ends_its_reply(template):
    """Seen with Codex: after a call's result the model wrote a `<tool_response>` block
    of its own. The reply ends before it (a plain stop, no stop sequence), and nothing of
    it is text."""
    d = chat_format(template).decode(ChatRequest([Message("user", "x")], tools=TOOLS))
    events = d.feed("It ran.\n<tool_resp")
    assert not d.stopped
    events += d.feed("onse>\nError: made up\n</tool_response>") + d.feed("more") + d.flush()
    assert d.stopped and d.stop_sequence is None and d.tool_calls == 0
    assert summary(events) == ("It ran.", "", [])


# ---- the serving loop: a call the model opens on its own is finished by the constraint --


def test_daemon_finishes_a_call_the_model_opens_and_never_sends_markup(tmp_path):
    """The embedded model (Hermes block, no forced choice) sometimes starts a call when
    asked to; the rest is constrained, so the call carries the schema's required keys
    with their types (enum, integer), even past max_tokens; no reply shows markup."""
    import openai

    from tests.e2e.daemon_process import running_daemon

    weather = {
        "type": "function",
        "function": {
            "name": "get_weather",
            "description": "Weather forecast for a city",
            "parameters": {
                "type": "object",
                "required": ["city", "days", "unit"],
                "properties": {
                    "city": {"type": "string"},
                    "days": {"type": "integer"},
                    "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]},
                },
            },
        },
    }
    with running_daemon(tmp_path) as d:
        client = openai.OpenAI(base_url=d.url + "/v1", api_key="x", max_retries=0)
        # Sampled: the model opens a call for some seeds only (3 does today; trying it
        # first only saves time, any of the eight passes).
        for seed in (3, 0, 1, 2, 4, 5, 6, 7):
            r = client.chat.completions.create(
                model="m",
                messages=[{"role": "user", "content": "Call get_weather with city Paris."}],
                tools=[weather],
                max_tokens=40,
                temperature=0.8,
                seed=seed,
            )
            message = r.choices[0].message
            assert not any(m in (message.content or "") for m in MARKUP)
            if message.tool_calls:
                break
        else:
            pytest.fail("the model opened no call in 8 seeds")
    (call,) = message.tool_calls
    args = json.loads(call.function.arguments)
    assert call.function.name == "get_weather" and r.choices[0].finish_reason == "tool_calls"
    assert list(args) == ["city", "days", "unit"] and args["unit"] in ("celsius", "fahrenheit")
    assert isinstance(args["days"], int) and isinstance(args["city"], str)


# ---- hostile output at random: markers, their fragments and JSON shards, shuffled -------

SHARDS = [
    *MARKUP,
    "<tool_",
    "call>",
    "</tool",
    "_call>",
    "<tool_resp",
    "onse>",
    "<|en",
    "d|>",
    "<|ca",
    "ll|>",
    "<|",
    "|>",
    "[TOOL_",
    "CALLS]",
    "<think>",
    "</think>",
    "<function=get_weather>",
    "<parameter=city>",
    "\n",
    " ",
    "{",
    "}",
    '"',
    '{"name": "get_weather", "arguments": {"city": "Paris"}}',
    '{"name": "run_shell", "parameters": {"command": "ls"}}',
    '"name": ',
    "get_weather",
    "[ARGS]",
    '{"city": "Oslo"}',
    " to=functions.get_weather",
    "analysis",
    "final",
    "commentary",
    "json",
    "Hello",
    ";",
]


# Each family hides its own markup; another family's is text to it.
OWN_MARKUP = {
    "hermes": ("<tool_call>", "</tool_call>", "<tool_response>", "</tool_response>"),
    "qwen3-coder-xml": (
        "<tool_call>",
        "</tool_call>",
        "<function=",
        "</function>",
        "</parameter>",
        "<tool_response>",
        "</tool_response>",
    ),
    "llama-json": ("<|python_tag|>",),
    "mistral-json": ("[TOOL_CALLS]", "[ARGS]", "[CALL_ID]"),
    "harmony": (
        "<|channel|>",
        "<|message|>",
        "<|start|>",
        "<|end|>",
        "<|call|>",
        "<|return|>",
        "<|constrain|>",
    ),
}


@pytest.mark.parametrize("template", sorted({t for _, t, _ in CASES}))
def test_random_hostile_output_never_shows_markup_and_parses_the_same_at_any_split(template):
    rng = random.Random(template)
    for _ in range(150):
        text = "".join(rng.choice(SHARDS) for _ in range(rng.randint(1, 14)))
        case = {"text": text}
        whole = summary(run(template, case, [])[0])
        for cuts in [
            sorted(rng.sample(range(1, len(text)), min(len(text) - 1, k))) for k in (1, 3, 9)
        ] + [list(range(1, len(text)))]:
            events, _ = run(template, case, cuts)
            assert summary(events) == whole, (text, cuts)
            joined = "".join(e.text for e in events if isinstance(e, TextDelta))
            for marker in OWN_MARKUP[chat_format(template).syntax.name]:
                assert marker not in joined, (text, marker)
