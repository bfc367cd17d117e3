"""Rendering a ChatRequest into prompt text for template-driven (llama-family) models.

The GGUF's own jinja template decides the turn markup. Tools go through the template
when it knows about them; otherwise (SmolLM2's template, for one) they are described in a
Hermes-style system block and calls are written back as `<tool_call>{json}</tool_call>`,
results as `<tool_response>` blocks in a user turn — the convention such models were
tuned on, and the one `stream.ToolCallParser` reads.

Rendering is deterministic and byte-stable: the same history always gives the same
text, which is what lets a later turn reuse the KV state of an earlier one.
"""

from __future__ import annotations

import json
from typing import Any, Protocol

from ds4d.chat.types import ChatRequest, Message, Tool, ToolCall


class Template(Protocol):
    source: str

    def render(
        self,
        messages: list[dict[str, Any]],
        add_generation_prompt: bool = True,
        tools: list[dict[str, Any]] | None = None,
        **extra: Any,
    ) -> str: ...


def template_supports_tools(source: str) -> bool:
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


def render_request(template: Template, request: ChatRequest) -> str:
    """Prompt text for `request`, ending with the assistant generation prompt."""
    if request.raw_prompt is not None:
        return request.raw_prompt
    # Templates of thinking models (Qwen3 style) switch reasoning with `enable_thinking`;
    # the others ignore the variable.
    extra = {} if request.thinking is None else {"enable_thinking": request.thinking}
    if template_supports_tools(template.source):
        return template.render(
            _native_messages(request.messages),
            add_generation_prompt=True,
            tools=[tool_schema(t) for t in request.tools] if request.tools_active else None,
            **extra,
        )
    return template.render(_hermes_messages(request), add_generation_prompt=True, **extra)


def _system_text(messages: list[Message]) -> str:
    return "\n\n".join(m.content for m in messages if m.role == "system" and m.content)


def _hermes_messages(request: ChatRequest) -> list[dict[str, Any]]:
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
    for m in request.messages:
        if m.role == "system":
            continue
        if m.role == "tool":
            block = f"<tool_response>\n{m.content}\n</tool_response>"
            if out and out[-1].get("_tool_results"):
                out[-1]["content"] += "\n" + block
            else:
                out.append({"role": "user", "content": block, "_tool_results": True})
            continue
        if m.role == "assistant":
            parts = [m.content] if m.content else []
            parts += [hermes_call_text(c) for c in m.tool_calls]
            out.append({"role": "assistant", "content": "\n".join(parts)})
            continue
        out.append({"role": m.role, "content": m.content})
    for d in out:
        d.pop("_tool_results", None)
    return out


def _native_messages(messages: list[Message]) -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = []
    system = _system_text(messages)
    if system:
        out.append({"role": "system", "content": system})
    for m in messages:
        if m.role == "system":
            continue
        d: dict[str, Any] = {"role": m.role, "content": m.content}
        if m.tool_calls:
            d["tool_calls"] = [
                {
                    "id": c.id,
                    "type": "function",
                    "function": {"name": c.name, "arguments": _json_or_text(c.arguments)},
                }
                for c in m.tool_calls
            ]
        if m.role == "tool":
            d["tool_call_id"] = m.tool_call_id
            if m.name:
                d["name"] = m.name
        out.append(d)
    return out


def _json_or_text(text: str) -> Any:
    try:
        return json.loads(text)
    except ValueError:
        return text
