"""Rendering a ChatRequest into prompt text for template-driven (llama-family) models.

The GGUF's own jinja template decides the turn markup. Tools go through the template
when it knows about them; otherwise (SmolLM2's or Gemma 3's template, for instance) they
are described in a Hermes-style system block and calls are written back as
`<tool_call>{json}</tool_call>`, results as `<tool_response>` blocks in a user turn — the
convention such models were tuned on, and the one `stream.ToolCallParser` reads.

Templates disagree on how a conversation must be shaped: arguments as an object or as
the JSON text, one call per assistant message or several, call ids of exactly nine
alphanumerics, strict user/assistant alternation. Rather than keying on model names,
`template_traits` finds out once per template by rendering small probe conversations,
and `render_request` shapes each request to fit. Past reasoning is passed under both
names templates read it from (`reasoning_content`, and `thinking` for gpt-oss), as
transformers does.

Rendering is deterministic and byte-stable: the same history always gives the same
text, which is what lets a later turn reuse the KV state of an earlier one.
"""

from __future__ import annotations

import hashlib
import json
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from functools import lru_cache
from typing import Any, Protocol

from ds4d.chat.template import TemplateError
from ds4d.chat.types import ChatRequest, Message, Tool, ToolCall


class Template(Protocol):
    source: str
    variables: frozenset[str]  # names the template reads from its context

    def render(
        self,
        messages: Sequence[Mapping[str, Any]],
        *,
        add_generation_prompt: bool = True,
        tools: Sequence[Mapping[str, Any]] | None = None,
        **extra: Any,
    ) -> str: ...

    def __hash__(self) -> int: ...  # template_traits caches per template


def template_supports_tools(source: str) -> bool:
    """A quick look at a template's source: does it mention tools and tool calls? (What
    it really accepts, `template_traits` finds by rendering.)"""
    return "tools" in source and "tool_call" in source


def tool_schema(tool: Tool) -> dict[str, Any]:
    return {
        "type": "function",
        "function": {
            "name": tool.name,
            "description": tool.description,
            "parameters": tool.parameters,
        },
    }


def hermes_tools_block(tools: list[Tool]) -> str:
    lines = "\n".join(json.dumps(tool_schema(t), ensure_ascii=False) for t in tools)
    return (
        "# Tools\n\n"
        "You may call one or more functions to help with the user's request.\n\n"
        "The available functions are described in JSON inside <tools></tools> tags:\n"
        f"<tools>\n{lines}\n</tools>\n\n"
        "To call a function, reply with a JSON object holding the function's name and its "
        "arguments inside <tool_call></tool_call> tags, for example:\n"
        "<tool_call>\n"
        '{"name": "function_name", "arguments": {"argument": "value"}}\n'
        "</tool_call>"
    )


def hermes_call_text(call: ToolCall) -> str:
    """How an assistant's past call is written back into the prompt."""
    try:
        args: Any = json.loads(call.arguments) if call.arguments.strip() else {}
    except ValueError:
        args = call.arguments  # keep what the client sent, as a string
    body = json.dumps({"name": call.name, "arguments": args}, ensure_ascii=False)
    return f"<tool_call>\n{body}\n</tool_call>"


def short_call_id(call_id: str) -> str:
    """A call id as templates that demand nine alphanumerics (Mistral's) accept it: kept
    when it already is one, else the first nine hex digits of its SHA-256, so a call and
    its result still agree and every turn renders the same id."""
    if _SHORT_ID.fullmatch(call_id):
        return call_id
    return hashlib.sha256(call_id.encode()).hexdigest()[:9]


_SHORT_ID = re.compile(r"[A-Za-z0-9]{9}")

# reasoning_effort values a template is given (gpt-oss knows low, medium and high).
_EFFORT = {
    "none": "low",
    "minimal": "low",
    "low": "low",
    "medium": "medium",
    "high": "high",
    "xhigh": "high",
    "max": "high",
}


# ---- what a template accepts ---------------------------------------------------------


@dataclass(frozen=True)
class TemplateTraits:
    native_tools: bool = False  # renders the tool list and past calls itself
    string_arguments: bool = False  # prints a call's arguments text verbatim
    one_call_per_message: bool = False  # renders only one call per assistant message
    short_call_ids: bool = False  # refuses call ids that are not nine alphanumerics
    no_text_with_reasoning_on_calls: bool = False  # refuses text + reasoning + a call
    alternating: bool = False  # refuses two user turns in a row


# Probe conversations use names no real conversation has, so finding one in the output
# means the template wrote it.
_PROBE_TOOL = "zq_probe_tool"
_PROBE_OTHER = "zq_other_tool"
_PROBE_ARGS = '{"zq_arg":"zq_value"}'
_PROBE_ID = "zqprobe01"  # nine alphanumerics: acceptable to every template
_PROBE_LONG_ID = "call_zq_probe_long_id"
_PROBE_USER = {"role": "user", "content": "zq probe question"}
_PROBE_SCHEMA = {"type": "object", "properties": {"zq_arg": {"type": "string"}}}


def _probe_turn(calls: list[tuple[str, str]], args: Any, **fields: Any) -> dict[str, Any]:
    """An assistant turn calling (name, id) pairs with `args`, plus any other fields."""
    tool_calls = [
        {"id": call_id, "type": "function", "function": {"name": name, "arguments": args}}
        for name, call_id in calls
    ]
    return {"role": "assistant", "content": "", **fields, "tool_calls": tool_calls}


def _probe_result(call_id: str) -> dict[str, Any]:
    return {"role": "tool", "tool_call_id": call_id, "content": "zq result"}


@lru_cache(maxsize=32)
def template_traits(template: Template) -> TemplateTraits:
    """What `template` accepts, found by rendering probe conversations (once per template)."""

    def rendered(messages: list[dict[str, Any]], tools: Any = None) -> str | None:
        try:
            return template.render(messages, add_generation_prompt=True, tools=tools)
        except TemplateError:
            return None

    def shows(needle: str, messages: list[dict[str, Any]], tools: Any = None) -> bool:
        text = rendered(messages, tools)
        return text is not None and needle in text

    def accepts(messages: list[dict[str, Any]]) -> bool:
        return rendered(messages) is not None

    user = _PROBE_USER
    alternating = accepts([user]) and not accepts([user, {"role": "user", "content": "zq"}])
    schema = [tool_schema(Tool(_PROBE_TOOL, "zq probe tool", _PROBE_SCHEMA))]
    dict_args = json.loads(_PROBE_ARGS)
    call = [(_PROBE_TOOL, _PROBE_ID)]
    if not (
        shows(_PROBE_TOOL, [user], schema)
        and shows(_PROBE_TOOL, [user, _probe_turn(call, dict_args)])
    ):
        return TemplateTraits(alternating=alternating)
    string_args = shows(_PROBE_ARGS, [user, _probe_turn(call, _PROBE_ARGS)])
    args: Any = _PROBE_ARGS if string_args else dict_args
    two_calls = [user, _probe_turn([*call, (_PROBE_OTHER, "zqprobe02")], args)]
    long_id = [(_PROBE_TOOL, _PROBE_LONG_ID)]
    thought = {"reasoning_content": "zq thought", "thinking": "zq thought"}
    return TemplateTraits(
        native_tools=True,
        string_arguments=string_args,
        one_call_per_message=not shows(_PROBE_OTHER, two_calls),
        short_call_ids=accepts([user, _probe_turn(call, args), _probe_result(_PROBE_ID)])
        and not accepts([user, _probe_turn(long_id, args), _probe_result(_PROBE_LONG_ID)]),
        no_text_with_reasoning_on_calls=accepts(
            [user, _probe_turn(call, args, **thought), _probe_result(_PROBE_ID)]
        )
        and not accepts(
            [user, _probe_turn(call, args, **thought, content="zq"), _probe_result(_PROBE_ID)]
        ),
        alternating=alternating,
    )


# ---- rendering -----------------------------------------------------------------------


def render_request(
    template: Template,
    request: ChatRequest,
    *,
    add_generation_prompt: bool = True,
    traits: TemplateTraits | None = None,
) -> str:
    """Prompt text for `request`, by default ending with the assistant generation prompt.
    `traits` overrides what the probes found (a chat format that knows better)."""
    if request.raw_prompt is not None:
        return request.raw_prompt
    traits = traits or template_traits(template)
    extra = _template_options(template, request)
    if traits.native_tools:
        tools = [tool_schema(t) for t in request.tools] if request.tools_active else None
        messages = _native_messages(request.messages, traits)
        return template.render(
            messages, add_generation_prompt=add_generation_prompt, tools=tools, **extra
        )
    return template.render(
        _hermes_messages(request, traits), add_generation_prompt=add_generation_prompt, **extra
    )


# Context names the renderer itself sets: a client's template kwargs never replace them.
_RESERVED_CONTEXT = frozenset(
    {"messages", "tools", "documents", "add_generation_prompt", "bos_token", "eos_token",
     "strftime_now", "raise_exception", "dict", "namespace"}
)  # fmt: skip


def _template_options(template: Template, request: ChatRequest) -> dict[str, Any]:
    # Thinking switches: Qwen3-style templates read `enable_thinking` (the others ignore
    # it), gpt-oss reads `reasoning_effort`; unset, each template keeps its default.
    # The client's own chat_template_kwargs go to a template that reads them.
    reads: frozenset[str] = getattr(template, "variables", frozenset())
    extra: dict[str, Any] = {
        k: v
        for k, v in request.template_kwargs.items()
        if k in reads and k not in _RESERVED_CONTEXT and k != "enable_thinking"
    }
    if request.thinking is not None:
        extra["enable_thinking"] = request.thinking
    if "reasoning_effort" in reads and "reasoning_effort" not in extra:
        effort = _EFFORT.get(request.reasoning_effort or "")
        if effort is None and request.thinking is False:
            effort = "low"
        if effort is not None:
            extra["reasoning_effort"] = effort
    return extra


def _system_text(messages: list[Message]) -> str:
    return "\n\n".join(m.content for m in messages if m.role == "system" and m.content)


def _with_reasoning(d: dict[str, Any], reasoning: str | None) -> dict[str, Any]:
    if reasoning is not None:
        d["reasoning_content"] = reasoning
        d["thinking"] = reasoning
    return d


def _merge_same_role_turns(out: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """For templates that insist on alternation: consecutive user turns become one, and
    so do consecutive assistant turns without calls (their reasoning joined too)."""
    merged: list[dict[str, Any]] = []
    for d in out:
        prev = merged[-1] if merged else None
        plain = d["role"] in ("user", "assistant") and "tool_calls" not in d
        if prev is None or not plain or prev["role"] != d["role"] or "tool_calls" in prev:
            merged.append(dict(d))
            continue
        prev["content"] = f"{prev['content']}\n\n{d['content']}"
        thoughts = [r for r in (prev.get("reasoning_content"), d.get("reasoning_content")) if r]
        if thoughts:
            _with_reasoning(prev, "\n\n".join(thoughts))
    return merged


def _hermes_messages(request: ChatRequest, traits: TemplateTraits) -> list[dict[str, Any]]:
    # All system text goes first, tools block ahead of it: the schemas are the large,
    # stable part of an agent prompt, the client's system text the part that changes.
    system_parts = []
    if request.tools_active:
        system_parts.append(hermes_tools_block(request.tools))
    system = _system_text(request.messages)
    if system:
        system_parts.append(system)
    out: list[dict[str, Any]] = []
    if system_parts:
        out.append({"role": "system", "content": "\n\n".join(system_parts)})
    results_turn: dict[str, Any] | None = None  # the user turn collecting tool results
    for m in request.messages:
        if m.role == "system":
            continue
        if m.role == "tool":
            block = f"<tool_response>\n{m.content}\n</tool_response>"
            if results_turn is not None and out[-1] is results_turn:
                results_turn["content"] += "\n" + block
            else:
                results_turn = {"role": "user", "content": block}
                out.append(results_turn)
            continue
        if m.role == "assistant":
            parts = [m.content] if m.content else []
            parts += [hermes_call_text(c) for c in m.tool_calls]
            out.append(
                _with_reasoning({"role": "assistant", "content": "\n".join(parts)}, m.reasoning)
            )
            continue
        out.append({"role": m.role, "content": m.content})
    return _merge_same_role_turns(out) if traits.alternating else out


def _native_messages(messages: list[Message], traits: TemplateTraits) -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = []
    system = _system_text(messages)
    if system:
        out.append({"role": "system", "content": system})
    rest = [m for m in messages if m.role != "system"]
    if traits.one_call_per_message:
        rest = _one_call_each(rest)
    # Anthropic and Responses results carry only the call id; templates that print a
    # result's tool name read it from `name`, so it is taken from the call.
    called = {c.id: c.name for m in rest for c in m.tool_calls}
    for m in rest:
        if m.role == "assistant":
            content, reasoning = m.content, m.reasoning
            if traits.no_text_with_reasoning_on_calls and m.tool_calls and content and reasoning:
                # The template takes either as the text before a call, not both.
                content, reasoning = "", f"{reasoning}\n\n{content}"
            d = _with_reasoning({"role": "assistant", "content": content}, reasoning)
            if m.tool_calls:
                d["tool_calls"] = [_call_dict(c, traits) for c in m.tool_calls]
            out.append(d)
        elif m.role == "tool":
            d = {"role": "tool", "content": m.content}
            if m.tool_call_id is not None:
                d["tool_call_id"] = (
                    short_call_id(m.tool_call_id) if traits.short_call_ids else m.tool_call_id
                )
            name = m.name or called.get(m.tool_call_id or "")
            if name:
                d["name"] = name
            out.append(d)
        else:
            out.append({"role": m.role, "content": m.content})
    return _merge_same_role_turns(out) if traits.alternating else out


def _call_dict(call: ToolCall, traits: TemplateTraits) -> dict[str, Any]:
    args: Any = call.arguments if traits.string_arguments else _arguments_object(call.arguments)
    call_id = short_call_id(call.id) if traits.short_call_ids else call.id
    return {"id": call_id, "type": "function", "function": {"name": call.name, "arguments": args}}


def _arguments_object(text: str) -> Any:
    if not text.strip():
        return {}
    try:
        return json.loads(text)
    except ValueError:
        return text  # not JSON: the client's text, as it sent it


def _one_call_each(messages: list[Message]) -> list[Message]:
    """Split an assistant message with several calls into one message per call, each
    followed by its results (matched by call id, else by position), for templates that
    render a single call per assistant turn."""
    out: list[Message] = []
    i = 0
    while i < len(messages):
        m = messages[i]
        i += 1
        if m.role != "assistant" or len(m.tool_calls) < 2:
            out.append(m)
            continue
        results: list[Message] = []
        while i < len(messages) and messages[i].role == "tool":
            results.append(messages[i])
            i += 1
        ids = [c.id for c in m.tool_calls]
        by_id = any(r.tool_call_id in ids for r in results)
        groups: list[list[Message]] = [[] for _ in m.tool_calls]
        for n, r in enumerate(results):
            if by_id:
                k = ids.index(r.tool_call_id) if r.tool_call_id in ids else len(ids) - 1
            else:
                k = min(n, len(ids) - 1)
            groups[k].append(r)
        for k, (call, group) in enumerate(zip(m.tool_calls, groups, strict=True)):
            first = k == 0
            out.append(
                Message(
                    "assistant", m.content if first else "", m.reasoning if first else None, [call]
                )
            )
            out.extend(group)
    return out
