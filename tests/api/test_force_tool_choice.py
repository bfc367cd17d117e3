"""The `force_tool_choice` testing aid: which requests it turns into forced calls (tools
declared, tool_choice left at auto, no tool call in the conversation yet) and which it
leaves alone, across the protocols' own request shapes."""

from __future__ import annotations

import pytest

from ds4d.api import anthropic_messages, openai_chat, openai_responses
from ds4d.api.common import force_tool_choice
from ds4d.chat.types import Sampling

D = Sampling()
FN = {"type": "object", "properties": {"cmd": {"type": "string"}}, "required": ["cmd"]}
CHAT_TOOLS = [
    {"type": "function", "function": {"name": "shell", "parameters": FN}},
    {"type": "function", "function": {"name": "read", "parameters": FN}},
]


def chat(messages, **extra):
    return openai_chat.parse({"messages": messages, "tools": CHAT_TOOLS, **extra}, D)


USER = [{"role": "user", "content": "hi"}]
CALL = {
    "role": "assistant",
    "content": None,
    "tool_calls": [
        {"id": "c1", "type": "function", "function": {"name": "shell", "arguments": "{}"}}
    ],
}
RESULT = {"role": "tool", "tool_call_id": "c1", "content": "done"}


@pytest.mark.parametrize(
    ("setting", "mode", "name"),
    [
        ("required", "required", None),
        ("read", "named", "read"),
    ],
)
def test_a_request_answering_the_user_is_forced(setting, mode, name):
    req = chat(USER)
    assert force_tool_choice(req, setting)
    assert (req.tool_choice.mode, req.tool_choice.name) == (mode, name)
    assert req.tool_choice.forced


def test_once_per_conversation():
    """A later user turn (Claude Code's "Output token limit hit. Resume directly" after a
    cut-off answer is one) is not forced again: the client's loop must end."""
    req = chat(
        [
            *USER,
            CALL,
            RESULT,
            {"role": "assistant", "content": "ok"},
            {"role": "user", "content": "again"},
        ]
    )
    assert not force_tool_choice(req, "shell") and req.tool_choice.mode == "auto"


@pytest.mark.parametrize("setting", ["", "required", "shell"])
def test_a_request_carrying_a_tool_result_stays_free(setting):
    """The client's loop ends: the model answers what the tool returned."""
    req = chat([*USER, CALL, RESULT])
    assert not force_tool_choice(req, setting)
    assert req.tool_choice.mode == "auto"


def test_left_alone_without_tools_an_unknown_name_or_an_explicit_choice():
    plain = openai_chat.parse({"messages": USER}, D)
    assert not force_tool_choice(plain, "required") and plain.tool_choice.mode == "auto"
    req = chat(USER)
    assert not force_tool_choice(req, "write") and req.tool_choice.mode == "auto"
    for choice, mode in (("none", "none"), ("required", "required")):
        req = chat(USER, tool_choice=choice)
        assert not force_tool_choice(req, "read") and req.tool_choice.mode == mode
    assert not force_tool_choice(chat(USER), "")


def test_anthropic_tool_results_sit_in_a_user_message():
    """Claude Code sends a tool result inside a user message, often with more text after
    it: still an answer to a tool, not a new user turn."""
    tools = [{"name": "Bash", "input_schema": FN}]
    messages = [
        {"role": "user", "content": "run it"},
        {
            "role": "assistant",
            "content": [{"type": "tool_use", "id": "t1", "name": "Bash", "input": {"cmd": "ls"}}],
        },
        {
            "role": "user",
            "content": [
                {"type": "tool_result", "tool_use_id": "t1", "content": "a.txt"},
                {"type": "text", "text": "<system-reminder>x</system-reminder>"},
            ],
        },
    ]
    req = anthropic_messages.parse({"max_tokens": 8, "tools": tools, "messages": messages}, D)
    assert not force_tool_choice(req, "Bash")
    first = anthropic_messages.parse({"max_tokens": 8, "tools": tools, "messages": messages[:1]}, D)
    assert force_tool_choice(first, "Bash") and first.tool_choice.name == "Bash"


def test_responses_namespaced_functions_are_named_by_their_own_name():
    """A function inside a Codex `namespace` tool is called (and forced) by its name."""
    body = {
        "input": "go",
        "tools": [
            {
                "type": "namespace",
                "name": "multi_agent_v1",
                "tools": [{"type": "function", "name": "resume_agent", "parameters": FN}],
            },
            {"type": "web_search"},
        ],
    }
    req = openai_responses.parse(body, D)
    assert force_tool_choice(req, "resume_agent") and req.tool_choice.name == "resume_agent"
    after = openai_responses.parse(
        {
            **body,
            "input": [
                {"type": "message", "role": "user", "content": "go"},
                {
                    "type": "function_call",
                    "call_id": "c9",
                    "name": "resume_agent",
                    "namespace": "multi_agent_v1",
                    "arguments": "{}",
                },
                {"type": "function_call_output", "call_id": "c9", "output": "not found"},
            ],
        },
        D,
    )
    assert not force_tool_choice(after, "resume_agent")
