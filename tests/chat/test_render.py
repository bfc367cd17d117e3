"""Prompt rendering through the embedded model's own chat template: Hermes tools block,
past calls and tool results, byte-stable prefixes across turns; and the real clients'
first requests parse and render."""

from __future__ import annotations

import json

import pytest

from ds4d.api import anthropic_messages, openai_chat, openai_responses
from ds4d.chat.render import render_request
from ds4d.chat.template import ChatTemplate
from ds4d.chat.types import ChatRequest, Message, Sampling, Tool, ToolCall, ToolChoice
from ds4d.engine.gguf_file import GGUFFile

TOOLS = [
    Tool("ls", "List a directory", {"type": "object", "properties": {"path": {"type": "string"}}})
]


@pytest.fixture(scope="module")
def template(model_path):
    return ChatTemplate(GGUFFile(model_path).chat_template, "<|im_start|>", "<|im_end|>")


def test_plain_chat_uses_the_template(template):
    text = render_request(
        template, ChatRequest([Message("system", "Be brief."), Message("user", "Hi")])
    )
    assert text == (
        "<|im_start|>system\nBe brief.<|im_end|>\n"
        "<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n"
    )


def test_tools_calls_and_results(template):
    msgs = [
        Message("system", "rules"),
        Message("user", "list /"),
        Message("assistant", "", tool_calls=[ToolCall("call_1", "ls", '{"path": "/"}')]),
        Message("tool", "bin etc", tool_call_id="call_1"),
        Message("tool", "usr", tool_call_id="call_2"),
    ]
    text = render_request(template, ChatRequest(msgs, tools=TOOLS))
    system = text.split("<|im_end|>")[0]
    assert system.startswith("<|im_start|>system\n# Tools")
    assert '"name": "ls"' in system and system.endswith("</tool_call>\n\nrules")
    assert (
        '<|im_start|>assistant\n<tool_call>\n{"name": "ls", "arguments": {"path": "/"}}'
        "\n</tool_call><|im_end|>"
    ) in text
    # consecutive results share one user turn
    assert (
        "<|im_start|>user\n<tool_response>\nbin etc\n</tool_response>\n"
        "<tool_response>\nusr\n</tool_response><|im_end|>"
    ) in text
    assert text.endswith("<|im_start|>assistant\n")
    none = render_request(template, ChatRequest(msgs, tools=TOOLS, tool_choice=ToolChoice("none")))
    assert "# Tools" not in none and "<tool_call>" in none  # history still rendered


def test_next_turn_extends_the_previous_prompt(template):
    first = [
        Message("user", "a"),
    ]
    second = [*first, Message("assistant", "b"), Message("user", "c")]
    p1 = render_request(template, ChatRequest(first, tools=TOOLS))
    p2 = render_request(template, ChatRequest(second, tools=TOOLS))
    assert p2.startswith(p1 + "b<|im_end|>\n")


def test_native_tool_templates_get_the_tools():
    source = (
        "{% if tools %}TOOLS:{{ tools | tojson }}\n{% endif %}{% for m in messages %}"
        "{{ m.role }}:{{ m.content }}{% if m.tool_calls %}"
        "{% for c in m.tool_calls %}[tool_call {{ c.function.name }}]{% endfor %}"
        "{% endif %}\n{% endfor %}"
    )
    text = render_request(
        ChatTemplate(source),
        ChatRequest(
            [
                Message("user", "x"),
                Message("assistant", "", tool_calls=[ToolCall("c", "ls", "{}")]),
            ],
            tools=TOOLS,
        ),
    )
    assert text.startswith('TOOLS:[{"type": "function", "function": {"name": "ls"')
    assert "[tool_call ls]" in text


@pytest.mark.parametrize(
    "name,parse",
    [
        ("claude-code-2.1.197-first-request.json", anthropic_messages.parse),
        ("codex-cli-0.171.0-first-request.json", openai_responses.parse),
    ],
)
def test_real_client_requests_parse_and_render(data_dir, template, name, parse):
    body = json.loads((data_dir / "fixtures" / "clients" / name).read_text())["body"]
    req = parse(body, Sampling())
    assert req.stream and req.tools and req.tool_choice.mode == "auto"
    text = render_request(template, req)
    assert "say hi" in text and text.endswith("<|im_start|>assistant\n")
    assert text.count("<|im_start|>system") == 1  # every system/developer text merged


def test_openai_tool_history_round_trips_through_render(template):
    req = openai_chat.parse(
        {
            "messages": [
                {"role": "user", "content": "x"},
                {
                    "role": "assistant",
                    "tool_calls": [
                        {
                            "id": "c1",
                            "type": "function",
                            "function": {"name": "ls", "arguments": '{"path":"/tmp"}'},
                        }
                    ],
                },
                {"role": "tool", "tool_call_id": "c1", "content": "f.txt"},
            ]
        },
        Sampling(),
    )
    text = render_request(template, req)
    assert '{"name": "ls", "arguments": {"path": "/tmp"}}' in text and "f.txt" in text


def test_thinking_switch_reaches_templates_that_read_it():
    source = (
        "{% for m in messages %}{{ m.role }}:{{ m.content }}\n{% endfor %}"
        "assistant:{% if enable_thinking is defined and not enable_thinking %}"
        "<think></think>{% endif %}"
    )
    t = ChatTemplate(source)
    msgs = [Message("user", "x")]
    assert render_request(t, ChatRequest(msgs, thinking=False)).endswith("<think></think>")
    assert render_request(t, ChatRequest(msgs, thinking=True)).endswith("assistant:")
    assert render_request(t, ChatRequest(msgs)).endswith("assistant:")


def test_template_format_decodes_reasoning_when_the_prompt_opens_it():
    from ds4d.chat.formats import TemplateChatFormat
    from ds4d.chat.types import ReasoningDelta, TextDelta

    r1 = TemplateChatFormat(
        ChatTemplate("{% for m in messages %}{{ m.content }}{% endfor %}<|Assistant|><think>\n")
    )
    decode = r1.decode(ChatRequest([Message("user", "x")]))
    events = decode.feed("plan</think>answer") + decode.flush()
    assert [type(e) for e in events] == [ReasoningDelta, TextDelta]
    plain = TemplateChatFormat(ChatTemplate("{% for m in messages %}{{ m.content }}{% endfor %}"))
    events = plain.decode(ChatRequest([Message("user", "x")])).feed("just text")
    assert [type(e) for e in events] == [TextDelta]
    assert plain.tokenize_special(ChatRequest([], raw_prompt="<|im_start|>")) is False


def test_source_look_and_probes_agree_on_the_family_templates():
    from pathlib import Path

    from ds4d.chat.render import template_supports_tools, template_traits

    for path in sorted((Path(__file__).parents[1] / "data" / "templates").glob("*.jinja")):
        source = path.read_text()
        native = template_traits(ChatTemplate(source, "<s>", "</s>")).native_tools
        assert template_supports_tools(source) == native, path.name


def test_generation_prompt_can_be_left_out(template):
    req = ChatRequest([Message("user", "Hi")])
    with_prompt = render_request(template, req)
    without = render_request(template, req, add_generation_prompt=False)
    assert with_prompt == without + "<|im_start|>assistant\n"


def test_tool_results_name_their_tool_for_templates_that_print_it():
    # Anthropic results carry only the call id: the name comes from the call.
    source = (
        "{% for t in tools or [] %}{{ t.function.name }};{% endfor %}"
        "{% for m in messages %}{% if m.tool_calls %}{{ m.tool_calls[0].function.name }}:call"
        "{% endif %}{% if m.role == 'tool' %}|{{ m.name }}={{ m.content }}{% endif %}"
        "{% endfor %}"
    )
    req = anthropic_messages.parse(
        {
            "max_tokens": 9,
            "tools": [{"name": "ls", "input_schema": {"type": "object"}}],
            "messages": [
                {"role": "user", "content": "x"},
                {
                    "role": "assistant",
                    "content": [{"type": "tool_use", "id": "toolu_1", "name": "ls", "input": {}}],
                },
                {
                    "role": "user",
                    "content": [{"type": "tool_result", "tool_use_id": "toolu_1", "content": "a"}],
                },
            ],
        },
        Sampling(),
    )
    assert render_request(ChatTemplate(source), req) == "ls;ls:call|ls=a"
