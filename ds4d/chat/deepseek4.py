"""DeepSeek V4 prompt rendering, byte for byte as ds4-server renders it.

The prompt is one string, tokenized with the chat markers split out (see
`ds4d.engine.ds4_tokenizer`):

    BOS [Think Max prefix] [tools block] [system texts]
    turns: <｜User｜>text | <｜User｜><tool_result>…</tool_result>… |
           <｜Assistant｜>(<think>reasoning</think> | </think>)content[DSML]EOS
    <｜Assistant｜><think>   (thinking)   or   <｜Assistant｜></think>   (not)

Every byte here is part of the cache key of every later turn: an assistant turn must
render exactly as the model produced it, or the next request cannot reuse the KV state.
"""

from __future__ import annotations

import enum
import json
from collections.abc import Sequence
from typing import Protocol

from ds4d.chat.deepseek4_dsml import is_dsml_block, parse_tool_calls, render_tool_calls
from ds4d.chat.types import ChatRequest, Message, Tool, ToolCall
from ds4d.engine.ds4_tokenizer import (
    ASSISTANT,
    BOS,
    EOS,
    THINK_CLOSE,
    THINK_OPEN,
    USER,
    DS4Tokenizer,
)

THINK_MAX_MIN_CONTEXT = 393216  # below this context Think Max falls back to High

THINK_MAX_PREFIX = (
    "Reasoning Effort: Absolute maximum with no shortcuts permitted.\n"
    "You MUST be very thorough in your thinking and comprehensively decompose the problem "
    "to resolve the root cause, rigorously stress-testing your logic against all potential "
    "paths, edge cases, and adversarial scenarios.\n"
    "Explicitly write out your entire deliberation process, documenting every intermediate "
    "step, considered alternative, and rejected hypothesis to ensure absolutely no "
    "assumption is left unchecked.\n"
    "\n"
)

TOOLS_PREAMBLE = (
    "## Tools\n\n"
    "You have access to a set of tools to help answer the user question. You can invoke "
    'tools by writing a "<｜DSML｜tool_calls>" block like the following:\n\n'
    "<｜DSML｜tool_calls>\n"
    '<｜DSML｜invoke name="$TOOL_NAME">\n'
    '<｜DSML｜parameter name="$PARAMETER_NAME" string="true|false">$PARAMETER_VALUE'
    "</｜DSML｜parameter>\n"
    "...\n"
    "</｜DSML｜invoke>\n"
    '<｜DSML｜invoke name="$TOOL_NAME2">\n'
    "...\n"
    "</｜DSML｜invoke>\n"
    "</｜DSML｜tool_calls>\n\n"
    'String parameters should be specified as raw text and set `string="true"`. Preserve '
    "characters such as `>`, `&`, and `&&` exactly; never replace normal string characters "
    "with XML or HTML entity escapes. Only if a string value itself contains the exact "
    "closing parameter tag `</｜DSML｜parameter>`, write that tag as "
    "`&lt;/｜DSML｜parameter>` inside the value. For all other types (numbers, booleans, "
    'arrays, objects), pass the value in JSON format and set `string="false"`.\n\n'
    "If thinking_mode is enabled (triggered by <think>), you MUST output your complete "
    "reasoning inside <think>...</think> BEFORE any tool calls or final response.\n\n"
    "Otherwise, output directly after </think> with tool calls or final response.\n\n"
    "### Available Tool Schemas\n\n"
)
TOOLS_SUFFIX = (
    "\n\nYou MUST strictly follow the above defined tool name and parameter schemas to "
    "invoke tool calls. Use the exact parameter names from the schemas."
)

# The system text of legacy /v1/completions prompts.
COMPLETION_SYSTEM = "You are a helpful assistant"

TOOL_RESULT_OPEN = "<tool_result>"
TOOL_RESULT_CLOSE = "</tool_result>"


class ThinkMode(enum.Enum):
    NONE = "none"
    HIGH = "high"
    MAX = "max"

    @property
    def thinking(self) -> bool:
        return self is not ThinkMode.NONE


_EFFORTS = {
    "max": ThinkMode.MAX,
    "xhigh": ThinkMode.HIGH,
    "high": ThinkMode.HIGH,
    "medium": ThinkMode.HIGH,
    "low": ThinkMode.HIGH,
    "minimal": ThinkMode.HIGH,
    "none": ThinkMode.NONE,
}


def think_mode(thinking: bool | None, effort: str | None, n_ctx: int) -> ThinkMode:
    """The effective mode: thinking is on unless turned off (`thinking=False` or effort
    "none"); effort "max" asks for Think Max, which needs a context of at least
    THINK_MAX_MIN_CONTEXT tokens and is otherwise High. An unknown effort raises
    ValueError (the API answers 400)."""
    mode = ThinkMode.HIGH
    if effort is not None:
        if effort not in _EFFORTS:
            raise ValueError(f"unknown reasoning effort {effort!r}")
        mode = _EFFORTS[effort]
    if thinking is False:
        mode = ThinkMode.NONE
    if mode is ThinkMode.MAX and n_ctx < THINK_MAX_MIN_CONTEXT:
        mode = ThinkMode.HIGH
    return mode


def tool_schema_line(tool: Tool) -> str:
    """One tool as one line of JSON, the function object as OpenAI clients send it."""
    schema: dict[str, object] = {"name": tool.name}
    if tool.description:
        schema["description"] = tool.description
    schema["parameters"] = tool.parameters
    return json.dumps(schema, ensure_ascii=False)


def tools_block(tools: Sequence[Tool]) -> str:
    return TOOLS_PREAMBLE + "\n".join(tool_schema_line(t) for t in tools) + TOOLS_SUFFIX


def escape_tool_result(text: str) -> str:
    """Tool output is data, kept verbatim; only its wrapper's closing tag is defused."""
    return text.replace(TOOL_RESULT_CLOSE, "&lt;" + TOOL_RESULT_CLOSE[1:])


def uses_tool_context(request: ChatRequest) -> bool:
    """Tools active, or tool calls/results in the history."""
    return request.tools_active or any(
        m.role == "tool" or (m.role == "assistant" and m.tool_calls) for m in request.messages
    )


class Replay(Protocol):
    """Tool-call id -> the exact DSML block the model generated for it (ToolMemory)."""

    def get(self, call_id: str) -> str | None: ...


def _dsml_for(calls: Sequence[ToolCall], replay: Replay | None) -> str:
    """The exact block the model sampled for these calls when every call maps to the
    same remembered block, else the canonical rendering.

    The block comes from `replay` by call id, or from the calls themselves: a tool memory
    that swaps each call's arguments for "the text sampled for it" hands DS4 calls their
    whole DSML block (that is what DS4Decode.replay gives it to remember)."""
    if not calls:
        return ""
    if replay is not None:
        blocks = {replay.get(c.id) for c in calls}
        if len(blocks) == 1 and None not in blocks:
            return blocks.pop() or ""
    if len({c.arguments for c in calls}) == 1 and is_dsml_block(calls[0].arguments):
        return calls[0].arguments
    return render_tool_calls([_with_json_arguments(c) for c in calls])


def _with_json_arguments(call: ToolCall) -> ToolCall:
    """A call whose arguments were swapped for a DSML block it shares with calls this
    message lacks: its own arguments, recovered from the block."""
    if not is_dsml_block(call.arguments):
        return call
    for _, name, arguments in parse_tool_calls(call.arguments):
        if name == call.name:
            return ToolCall(call.id, call.name, arguments)
    return call


def render_request(request: ChatRequest, mode: ThinkMode, replay: Replay | None = None) -> str:
    """The prompt text of a chat request. `replay` maps tool-call ids to the raw DSML
    blocks the model generated for them (exact replay keeps the KV cache aligned)."""
    messages = request.messages
    system = tools_block(request.tools) if request.tools_active else ""
    for m in messages:
        if m.role == "system":
            system += ("\n\n" if system else "") + m.content

    tool_context = uses_tool_context(request)
    last_user = max((i for i, m in enumerate(messages) if m.role in ("user", "tool")), default=-1)
    out = [BOS, THINK_MAX_PREFIX if mode is ThinkMode.MAX else "", system]
    pending_assistant = pending_tool_result = False
    for i, m in enumerate(messages):
        if m.role == "user":
            out += [USER, m.content]
            pending_assistant, pending_tool_result = True, False
        elif m.role == "tool":
            if not pending_tool_result:
                out.append(USER)
            out += [TOOL_RESULT_OPEN, escape_tool_result(m.content), TOOL_RESULT_CLOSE]
            pending_assistant = pending_tool_result = True
        elif m.role == "assistant":
            if pending_assistant:
                out.append(ASSISTANT)
                keep_reasoning = mode.thinking and (tool_context or i > last_user)
                out.append(_think_part(m, keep_reasoning))
            out += [m.content, _dsml_for(m.tool_calls, replay), EOS]
            pending_assistant = pending_tool_result = False
    if pending_assistant:
        out += [ASSISTANT, THINK_OPEN if mode.thinking else THINK_CLOSE]
    return "".join(out)


def _think_part(m: Message, keep_reasoning: bool) -> str:
    if keep_reasoning:
        return THINK_OPEN + (m.reasoning or "") + THINK_CLOSE
    return THINK_CLOSE  # earlier turns' reasoning is dropped


def render_completion(prompt: str, mode: ThinkMode) -> str:
    """The prompt of a legacy /v1/completions request."""
    prefix = THINK_MAX_PREFIX if mode is ThinkMode.MAX else ""
    think = THINK_OPEN if mode.thinking else THINK_CLOSE
    return f"{BOS}{prefix}{COMPLETION_SYSTEM}{USER}{prompt}{ASSISTANT}{think}"


def assistant_suffix(
    mode: ThinkMode, reasoning: str | None, content: str, calls: Sequence[ToolCall]
) -> str:
    """What a finished assistant turn adds after its prompt (which ends with the think
    tag), in the form the next request renders it: the canonical text to compare the
    live KV tokens with after a tool-call turn."""
    think = (reasoning or "") + THINK_CLOSE if mode.thinking else ""
    return think + content + render_tool_calls(calls) + EOS


def encode_single_prompt(
    tokenizer: DS4Tokenizer, prompt: str, system: str = "", mode: ThinkMode = ThinkMode.NONE
) -> list[int]:
    """Token ids of a one-shot prompt as ds4's CLI builds it (each piece encoded apart, no
    merges across pieces): BOS, Think Max prefix, system, User, prompt, Assistant, think tag."""
    ids = [tokenizer.bos_id]
    if mode is ThinkMode.MAX:
        ids += tokenizer.encode(THINK_MAX_PREFIX, special=False)
    ids += tokenizer.encode(system, special=False)
    ids.append(tokenizer.user_id)
    ids += tokenizer.encode(prompt, special=False)
    ids.append(tokenizer.assistant_id)
    ids.append(tokenizer.think_open_id if mode.thinking else tokenizer.think_close_id)
    return ids
