"""POST /v1/chat/completions: OpenAI chat request <-> neutral request and events."""

from __future__ import annotations

import time
from typing import Any

from ds4d.api.common import (
    KEEPALIVE,
    ApiError,
    Completion,
    bad,
    content_text,
    field_of,
    json_text,
    max_tokens_of,
    objects_of,
    random_id,
    request_object,
    sampling_of,
    sse,
    steering_of,
    stop_list,
    template_kwargs_of,
    thinking_switch,
)
from ds4d.api.output_format import openai_response_format
from ds4d.chat.types import (
    ChatRequest,
    Event,
    Finish,
    Message,
    ReasoningDelta,
    Role,
    Sampling,
    TextDelta,
    Tool,
    ToolCall,
    ToolCallArgsDelta,
    ToolCallStart,
    ToolChoice,
    Usage,
)

TEXT_PARTS = ("text", "input_text", "output_text")
ROLES: dict[str, Role] = {
    "system": "system",
    "developer": "system",
    "user": "user",
    "assistant": "assistant",
    "tool": "tool",
    "function": "tool",
}


def error_body(err: ApiError) -> dict[str, Any]:
    return {
        "error": {
            "message": err.message,
            "type": err.kind,
            "param": err.param,
            "code": err.code,
            **err.extra,
        }
    }


def parse_tools(value: Any) -> list[Tool]:
    """OpenAI function tools; other tool kinds are skipped (nothing the model can call)."""
    tools = []
    for n, t in objects_of(value, "tools", param="tools"):
        fn = t.get("function") if t.get("type", "function") == "function" else None
        if fn is None and t.get("type") == "function" and "name" in t:
            fn = t  # the flat Responses form, accepted here too
        if fn is None:
            continue
        if not isinstance(fn, dict):
            raise bad(f"'tools[{n}].function' must be an object", "tools")
        name = field_of(fn, "name", str, where=f"tools[{n}].function", required=True)
        params = field_of(
            fn,
            "parameters",
            dict,
            {"type": "object", "properties": {}},
            where=f"tools[{n}].function",
        )
        tools.append(Tool(name, field_of(fn, "description", str, "", where=f"tools[{n}]"), params))
    return tools


def parse_tool_choice(value: Any, tools: list[Tool]) -> ToolChoice:
    if value is None or value == "auto":
        return ToolChoice("auto")
    if value == "none":
        return ToolChoice("none")
    if value in ("required", "any"):
        if not tools:
            raise bad("tool_choice 'required' needs at least one tool", "tool_choice")
        return ToolChoice("required")
    if isinstance(value, dict):
        fn = value.get("function")
        name = (fn if isinstance(fn, dict) else value).get("name")
        if isinstance(name, str):
            if name not in {t.name for t in tools}:
                raise bad(
                    f"tool_choice names '{name}', which is not among the tools", "tool_choice"
                )
            return ToolChoice("named", name)
        kind = value.get("type")
        if kind in ("auto", "none", "required", "any"):
            return parse_tool_choice(kind, tools)
    raise bad("'tool_choice' must be 'auto', 'none', 'required' or a named function", "tool_choice")


def parse_messages(value: Any) -> list[Message]:
    out = []
    for n, m in objects_of(value, "messages", param="messages", required=True):
        where = f"messages[{n}]"
        role = field_of(m, "role", str, where=where, required=True)
        if role not in ROLES:
            raise bad(f"'{where}.role' must be one of {', '.join(ROLES)}", "messages")
        msg = Message(ROLES[role], content_text(m.get("content"), f"{where}.content", TEXT_PARTS))
        reasoning = m.get("reasoning_content", m.get("reasoning"))
        if isinstance(reasoning, str) and reasoning:
            msg.reasoning = reasoning
        for k, call in enumerate(field_of(m, "tool_calls", list, [], where=where)):
            fn = call.get("function") if isinstance(call, dict) else None
            if not isinstance(fn, dict):
                raise bad(f"'{where}.tool_calls[{k}].function' must be an object", "messages")
            name = field_of(
                fn, "name", str, where=f"{where}.tool_calls[{k}].function", required=True
            )
            msg.tool_calls.append(
                ToolCall(
                    str(call.get("id") or random_id("call_", 16)),
                    name,
                    json_text(fn.get("arguments"), f"{where}.tool_calls[{k}].function.arguments"),
                )
            )
        if msg.role == "tool":
            msg.tool_call_id = field_of(m, "tool_call_id", str, None, where=where)
            msg.name = field_of(m, "name", str, None, where=where)
        out.append(msg)
    return out


def parse(body: Any, defaults: Sampling) -> ChatRequest:
    body = request_object(body)
    messages = parse_messages(body.get("messages"))
    tools = parse_tools(body.get("tools"))
    template_kwargs = template_kwargs_of(body.get("chat_template_kwargs"))
    thinking = thinking_switch(template_kwargs, body.get("reasoning_effort"))
    stream_options = field_of(body, "stream_options", dict, {})
    req = ChatRequest(
        messages=messages,
        tools=tools,
        tool_choice=parse_tool_choice(body.get("tool_choice"), tools),
        sampling=sampling_of(body, defaults),
        max_tokens=max_tokens_of(body, "max_completion_tokens", "max_tokens"),
        stop=stop_list(body.get("stop")),
        thinking=thinking,
        reasoning_effort=body.get("reasoning_effort"),
        template_kwargs=template_kwargs,
        model=field_of(body, "model", str, ""),
        stream=field_of(body, "stream", bool, False),
        output_format=openai_response_format(body),
        steering=steering_of(body.get("steering")),
    )
    req.include_usage = field_of(
        stream_options, "include_usage", bool, False, where="stream_options"
    )
    n = field_of(body, "n", int, 1)
    if n != 1:
        raise bad("only n=1 is supported", "n")
    return req


def usage_json(u: Usage) -> dict[str, Any]:
    return {
        "prompt_tokens": u.prompt_tokens,
        "completion_tokens": u.completion_tokens,
        "total_tokens": u.prompt_tokens + u.completion_tokens,
        "prompt_tokens_details": {"cached_tokens": u.cached_tokens},
    }


def finish_reason(f: Finish) -> str:
    return f.reason


def response(req: ChatRequest, c: Completion, model: str) -> dict[str, Any]:
    message: dict[str, Any] = {"role": "assistant", "content": c.text}
    if c.reasoning:
        message["reasoning_content"] = c.reasoning
    if c.tool_calls:
        message["tool_calls"] = [
            {"id": t.id, "type": "function", "function": {"name": t.name, "arguments": t.arguments}}
            for t in c.tool_calls
        ]
    return {
        "id": random_id("chatcmpl-"),
        "object": "chat.completion",
        "created": int(time.time()),
        "model": model,
        "choices": [
            {
                "index": 0,
                "message": message,
                "logprobs": None,
                "finish_reason": finish_reason(c.finish),
            }
        ],
        "usage": usage_json(c.usage),
    }


class Stream:
    """Chat completion chunks: role, reasoning/content deltas, tool-call deltas (id and
    name first, then argument fragments), finish, usage chunk if asked, [DONE]."""

    def __init__(self, req: ChatRequest, model: str) -> None:
        self.req = req
        self.id = random_id("chatcmpl-")
        self.created = int(time.time())
        self.model = model
        self.usage: Usage | None = None

    def _chunk(self, delta: dict[str, Any], finish: str | None = None) -> str:
        return sse(
            {
                "id": self.id,
                "object": "chat.completion.chunk",
                "created": self.created,
                "model": self.model,
                "choices": [
                    {"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish}
                ],
            }
        )

    def open(self) -> list[str]:
        return [self._chunk({"role": "assistant", "content": ""})]

    def keepalive(self) -> str:
        return KEEPALIVE

    def feed(self, ev: Event) -> list[str]:
        if isinstance(ev, TextDelta):
            return [self._chunk({"content": ev.text})]
        if isinstance(ev, ReasoningDelta):
            return [self._chunk({"reasoning_content": ev.text})]
        if isinstance(ev, ToolCallStart):
            return [
                self._chunk(
                    {
                        "tool_calls": [
                            {
                                "index": ev.index,
                                "id": ev.id,
                                "type": "function",
                                "function": {"name": ev.name, "arguments": ""},
                            }
                        ]
                    }
                )
            ]
        if isinstance(ev, ToolCallArgsDelta):
            return [
                self._chunk(
                    {"tool_calls": [{"index": ev.index, "function": {"arguments": ev.text}}]}
                )
            ]
        if isinstance(ev, Usage):
            self.usage = ev
            return []
        if isinstance(ev, Finish):
            out = [self._chunk({}, finish_reason(ev))]
            if self.req.include_usage and self.usage is not None:
                out.append(
                    sse(
                        {
                            "id": self.id,
                            "object": "chat.completion.chunk",
                            "created": self.created,
                            "model": self.model,
                            "choices": [],
                            "usage": usage_json(self.usage),
                        }
                    )
                )
            out.append(sse("[DONE]"))
            return out
        return []

    def error(self, err: ApiError) -> list[str]:
        return [sse(error_body(err), "error"), sse("[DONE]")]
