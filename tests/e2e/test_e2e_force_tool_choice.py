"""`--force-tool-choice` on a real daemon, driven by the openai SDK: a request that
answers the user calls the tool (under the forced-call constraints, so even SmolLM2's
arguments parse), the request carrying the tool's result is answered freely, and on
/v1/responses a function of a `namespace` tool is called with its namespace named."""

from __future__ import annotations

import json

import openai
import pytest

from tests.e2e.daemon_process import running_daemon

SHELL = {
    "type": "function",
    "function": {
        "name": "shell",
        "description": "Run a shell command.",
        "parameters": {
            "type": "object",
            "properties": {"cmd": {"type": "string"}},
            "required": ["cmd"],
        },
    },
}


@pytest.fixture(scope="module")
def oai(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("ds4d-force")
    args = ("--slots", "1", "--ctx", "2048", "--force-tool-choice", "required")
    with running_daemon(tmp, *args) as d:
        yield openai.OpenAI(base_url=f"{d.url}/v1", api_key="x", max_retries=0, timeout=120)


def test_a_user_turn_calls_the_tool_and_its_result_is_answered_freely(oai):
    messages = [{"role": "user", "content": "List the files."}]
    first = oai.chat.completions.create(model="m", max_tokens=8, messages=messages, tools=[SHELL])
    choice = first.choices[0]
    assert choice.finish_reason == "tool_calls"
    call = choice.message.tool_calls[0]
    assert call.function.name == "shell" and "cmd" in json.loads(call.function.arguments)

    messages += [
        choice.message.model_dump(exclude_none=True),
        {"role": "tool", "tool_call_id": call.id, "content": "a.txt b.txt"},
    ]
    second = oai.chat.completions.create(
        model="m", max_tokens=8, temperature=0, messages=messages, tools=[SHELL]
    )
    assert second.choices[0].finish_reason in ("stop", "length")
    assert not second.choices[0].message.tool_calls
    # The same conversation on the one slot: the call's whole prompt was reused.
    assert second.usage.prompt_tokens_details.cached_tokens >= first.usage.prompt_tokens


def test_without_tools_or_with_an_explicit_choice_nothing_is_forced(oai):
    plain = oai.chat.completions.create(
        model="m", max_tokens=4, messages=[{"role": "user", "content": "Say hi."}]
    )
    assert plain.choices[0].finish_reason != "tool_calls"
    none = oai.chat.completions.create(
        model="m",
        max_tokens=4,
        tools=[SHELL],
        tool_choice="none",
        messages=[{"role": "user", "content": "Say hi."}],
    )
    assert none.choices[0].finish_reason != "tool_calls"


def test_responses_namespaced_function_is_called_with_its_namespace(oai):
    tools = [
        {
            "type": "namespace",
            "name": "multi_agent_v1",
            "description": "Sub-agents.",
            "tools": [
                {
                    "type": "function",
                    "name": "resume_agent",
                    "description": "Resume an agent.",
                    "parameters": {
                        "type": "object",
                        "properties": {"id": {"type": "string"}},
                        "required": ["id"],
                    },
                }
            ],
        }
    ]
    r = oai.responses.create(model="m", input="Resume agent 7.", tools=tools, max_output_tokens=8)
    calls = [o for o in r.output if o.type == "function_call"]
    assert calls and calls[0].name == "resume_agent"
    assert calls[0].model_dump().get("namespace") == "multi_agent_v1"
