"""POST /v1/messages and /v1/messages/count_tokens: Anthropic Messages <-> neutral."""

from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass
from typing import Any

from ds4d.api.common import (
    KEEPALIVE,
    ApiError,
    Completion,
    bad,
    content_text,
    effort_thinking,
    field_of,
    json_text,
    objects_of,
    random_id,
    request_object,
    sampling_of,
    sse,
    steering_of,
    stop_list,
)
from ds4d.chat.types import (
    ChatRequest,
    Event,
    Finish,
    Message,
    ReasoningDelta,
    Sampling,
    TextDelta,
    Tool,
    ToolCall,
    ToolCallArgsDelta,
    ToolCallEnd,
    ToolCallStart,
    ToolChoice,
    Usage,
)

ERROR_TYPES = {
    400: "invalid_request_error",
    401: "authentication_error",
    403: "permission_error",
    404: "not_found_error",
    413: "request_too_large",
    429: "rate_limit_error",
    503: "overloaded_error",
    529: "overloaded_error",
}


def error_body(err: ApiError) -> dict[str, Any]:
    kind = ERROR_TYPES.get(err.status, "api_error" if err.status >= 500 else err.kind)
    return {"type": "error", "error": {"type": kind, "message": err.message, **err.extra}}


def _system_text(value: Any) -> str:
    if value is None:
        return ""
    if isinstance(value, str):
        return value
    if isinstance(value, list):
        parts = []
        for n, block in enumerate(value):
            if isinstance(block, dict) and isinstance(block.get("text", ""), str):
                parts.append(block.get("text", ""))
            elif isinstance(block, str):
                parts.append(block)
            else:
                raise bad(f"'system[{n}]' must be a text block")
        return "\n".join(p for p in parts if p)
    raise bad("'system' must be a string or an array of text blocks")


def _tool_result_text(value: Any, where: str) -> str:
    return content_text(value, where, ("text",))


def _messages(value: Any) -> list[Message]:
    out: list[Message] = []
    for n, m in objects_of(value, "messages", required=True):
        where = f"messages[{n}]"
        role = field_of(m, "role", str, where=where, required=True)
        if role not in ("user", "assistant", "system"):
            raise bad(f"'{where}.role' must be 'user' or 'assistant'")
        content = m.get("content")
        if isinstance(content, str) or content is None:
            out.append(Message(role, content or ""))
            continue
        if not isinstance(content, list):
            raise bad(f"'{where}.content' must be a string or an array of content blocks")
        msg = Message(role)
        for k, block in enumerate(content):
            bwhere = f"{where}.content[{k}]"
            if isinstance(block, str):
                msg.content += block
                continue
            if not isinstance(block, dict):
                raise bad(f"'{bwhere}' must be an object")
            kind = block.get("type")
            if kind == "text":
                msg.content += field_of(block, "text", str, "", where=bwhere)
            elif kind == "thinking":
                # An empty block (a keepalive's, see Stream.keepalive) renders as none.
                thought = field_of(block, "thinking", str, "", where=bwhere)
                if thought:
                    msg.reasoning = (msg.reasoning or "") + thought
            elif kind in ("tool_use", "server_tool_use"):
                name = field_of(block, "name", str, where=bwhere, required=True)
                call_id = field_of(block, "id", str, where=bwhere, required=True)
                msg.tool_calls.append(
                    ToolCall(call_id, name, json_text(block.get("input", {}), f"{bwhere}.input"))
                )
            elif kind == "tool_result":
                # A result belongs to the call before it: it is rendered as its own tool
                # turn, ahead of whatever text the user adds in the same message.
                call_id = field_of(block, "tool_use_id", str, where=bwhere, required=True)
                text = _tool_result_text(block.get("content"), f"{bwhere}.content")
                if block.get("is_error") is True:
                    text = f"Error: {text}"
                out.append(Message("tool", text, tool_call_id=call_id))
            # images, documents, redacted thinking, search results: not for this model
        if msg.content or msg.tool_calls or msg.reasoning or role != "user":
            out.append(msg)
    return out


def parse_tools(value: Any) -> list[Tool]:
    tools = []
    for n, t in objects_of(value, "tools"):
        if "input_schema" not in t:
            continue  # server tools (web_search, code_execution...): nothing to call here
        name = field_of(t, "name", str, where=f"tools[{n}]", required=True)
        schema = field_of(t, "input_schema", dict, where=f"tools[{n}]", required=True)
        tools.append(Tool(name, field_of(t, "description", str, "", where=f"tools[{n}]"), schema))
    return tools


def parse_tool_choice(value: Any, tools: list[Tool]) -> ToolChoice:
    if value is None:
        return ToolChoice("auto")
    if not isinstance(value, dict):
        raise bad("'tool_choice' must be an object")
    kind = value.get("type")
    if kind == "auto":
        return ToolChoice("auto")
    if kind == "none":
        return ToolChoice("none")
    if kind == "any":
        if not tools:
            raise bad("tool_choice 'any' needs at least one tool")
        return ToolChoice("required")
    if kind == "tool":
        name = field_of(value, "name", str, where="tool_choice", required=True)
        if name not in {t.name for t in tools}:
            raise bad(f"tool_choice names '{name}', which is not among the tools")
        return ToolChoice("named", name)
    raise bad("'tool_choice.type' must be auto, any, tool or none")


def _thinking(body: dict[str, Any]) -> bool | None:
    value = body.get("thinking")
    if value is not None:
        if not isinstance(value, dict):
            raise bad("'thinking' must be an object")
        kind = value.get("type")
        if kind == "disabled":
            return False
        if kind in ("enabled", "adaptive"):
            return True
        raise bad("'thinking.type' must be enabled, adaptive or disabled")
    config = field_of(body, "output_config", dict, {})
    return effort_thinking(config.get("effort"), "output_config.effort")


@dataclass
class MessagesRequest(ChatRequest):
    """A chat request plus the prefix the client marked with `cache_control`, whose
    length decides how the prompt splits into input and cache-creation tokens."""

    cache_prefix: ChatRequest | None = None  # up to the last cache_control mark
    cache_prefix_tokens: int = 0  # that prefix's length in the prompt, once prepared


def _marked(value: Any) -> bool:
    return isinstance(value, dict) and value.get("cache_control") is not None


def _last_cache_mark(body: dict[str, Any]) -> int | None:
    """Where the last `cache_control` sits: -1 for tools or system, n for messages[n];
    None when the client marked nothing."""
    last = None
    for key in ("tools", "system"):
        if isinstance(body.get(key), list) and any(_marked(b) for b in body[key]):
            last = -1
    messages = body.get("messages")
    for n, m in enumerate(messages if isinstance(messages, list) else []):
        content = m.get("content") if isinstance(m, dict) else None
        if _marked(m) or isinstance(content, list) and any(_marked(b) for b in content):
            last = n
    return last


def _with_system(messages: list[Message], system: str) -> list[Message]:
    # Claude Code also sends system-role messages inside `messages`; render order puts
    # every system text first anyway.
    return [Message("system", system), *messages] if system else messages


def parse(body: Any, defaults: Sampling, *, count_only: bool = False) -> ChatRequest:
    body = request_object(body)
    system = _system_text(body.get("system"))
    messages = _with_system(_messages(body.get("messages")), system)
    tools = parse_tools(body.get("tools"))
    max_tokens = field_of(body, "max_tokens", int, None)
    if max_tokens is None and not count_only:
        raise bad("'max_tokens' is required")
    if max_tokens is not None and max_tokens < 1:
        raise bad("'max_tokens' must be at least 1")
    req = MessagesRequest(
        messages=messages,
        tools=tools,
        tool_choice=parse_tool_choice(body.get("tool_choice"), tools),
        sampling=sampling_of(body, defaults, max_temperature=1.0),
        max_tokens=max_tokens,
        stop=stop_list(body.get("stop_sequences"), "stop_sequences"),
        thinking=_thinking(body),
        reasoning_effort=field_of(body, "output_config", dict, {}).get("effort"),
        model=field_of(body, "model", str, ""),
        stream=field_of(body, "stream", bool, False),
        tool_id_prefix="toolu_",
        steering=steering_of(body.get("steering")),
    )
    mark = _last_cache_mark(body)
    if mark is not None:
        head = _messages(body["messages"][: mark + 1]) if mark >= 0 else []
        req.cache_prefix = dataclasses.replace(
            req, messages=_with_system(head, system), cache_prefix=None
        )
    return req


def usage_json(u: Usage, req: ChatRequest) -> dict[str, Any]:
    """The Messages API's split of the prompt: read from the cache (every reused token,
    as ds4d reuses prefixes unasked), written to a cache the client asked for (the part
    of its `cache_control` prefix not read), and the rest as plain input."""
    marked = req.cache_prefix_tokens if isinstance(req, MessagesRequest) else 0
    read = min(u.cached_tokens, u.prompt_tokens)
    created = max(0, min(marked, u.prompt_tokens) - read)
    return {
        "input_tokens": u.prompt_tokens - read - created,
        "output_tokens": u.completion_tokens,
        "cache_read_input_tokens": read,
        "cache_creation_input_tokens": created,
    }


def stop_reason(f: Finish) -> tuple[str, str | None]:
    if f.reason == "tool_calls":
        return "tool_use", None
    if f.reason == "length":
        return "max_tokens", None
    if f.stop_sequence is not None:
        return "stop_sequence", f.stop_sequence
    return "end_turn", None


def response(req: ChatRequest, c: Completion, model: str) -> dict[str, Any]:
    msg_id = random_id("msg_")
    content: list[dict[str, Any]] = []
    if c.reasoning:
        content.append({"type": "thinking", "thinking": c.reasoning, "signature": msg_id})
    if c.text:
        content.append({"type": "text", "text": c.text})
    for t in c.tool_calls:
        content.append(
            {"type": "tool_use", "id": t.id, "name": t.name, "input": json.loads(t.arguments)}
        )
    if not any(b["type"] != "thinking" for b in content):
        content.append({"type": "text", "text": ""})
    reason, seq = stop_reason(c.finish)
    return {
        "id": msg_id,
        "type": "message",
        "role": "assistant",
        "model": model,
        "content": content,
        "stop_reason": reason,
        "stop_sequence": seq,
        "usage": usage_json(c.usage, req),
    }


class Stream:
    """message_start, content blocks (thinking, text, tool_use with input_json_delta),
    message_delta with stop_reason and usage, message_stop.

    message_start's usage counts the whole prompt as input: the split into cache reads
    and writes is known once the slot is synced, and message_delta carries it (its
    counts are totals that replace message_start's)."""

    def __init__(self, req: ChatRequest, model: str) -> None:
        self.req = req
        self.id = random_id("msg_")
        self.model = model
        self.started = False
        self.block: str | None = None  # kind of the open content block
        self.index = -1
        self.usage: Usage | None = None
        self.any_block = False

    @staticmethod
    def _ev(name: str, data: dict[str, Any]) -> str:
        return sse({"type": name, **data}, name)

    def open(self) -> list[str]:
        # message_start goes out with the first event: the prompt's token count, which
        # the generation reports before it waits for a slot or prefills.
        return []

    def keepalive(self) -> str:
        """Before message_start only a comment is valid. After it, an empty delta of the
        open content block, opening an empty thinking block first if none is open:
        Claude Code drops a stream after 300 s without a content event, and counts
        neither SSE comments nor `ping` events (its SDK skips pings). A thinking block
        is what a reply may open with before anything is known about it; the model's
        own reasoning continues in it, text or a tool call follows it."""
        if not self.started:
            return KEEPALIVE
        out = []
        if self.block is None:
            out += self._open("thinking", {"type": "thinking", "thinking": "", "signature": ""})
        delta = {
            "thinking": {"type": "thinking_delta", "thinking": ""},
            "text": {"type": "text_delta", "text": ""},
            "tool_use": {"type": "input_json_delta", "partial_json": ""},
        }[self.block or ""]
        out.append(self._ev("content_block_delta", {"index": self.index, "delta": delta}))
        return "".join(out)

    def _start(self, usage: Usage) -> list[str]:
        self.started = True
        return [
            self._ev(
                "message_start",
                {
                    "message": {
                        "id": self.id,
                        "type": "message",
                        "role": "assistant",
                        "model": self.model,
                        "content": [],
                        "stop_reason": None,
                        "stop_sequence": None,
                        "usage": usage_json(usage, self.req),
                    }
                },
            ),
            self._ev("ping", {}),
        ]

    def _close(self) -> list[str]:
        if self.block is None:
            return []
        out = []
        if self.block == "thinking":
            out.append(
                self._ev(
                    "content_block_delta",
                    {
                        "index": self.index,
                        "delta": {"type": "signature_delta", "signature": self.id},
                    },
                )
            )
        out.append(self._ev("content_block_stop", {"index": self.index}))
        self.block = None
        return out

    def _open(self, kind: str, block: dict[str, Any]) -> list[str]:
        out = self._close()
        self.index += 1
        self.block = kind
        self.any_block = self.any_block or kind != "thinking"
        out.append(self._ev("content_block_start", {"index": self.index, "content_block": block}))
        return out

    def feed(self, ev: Event) -> list[str]:
        out: list[str] = []
        if isinstance(ev, Usage):
            self.usage = ev
            return [] if self.started else self._start(ev)
        if not self.started:
            out += self._start(Usage(0, 0))
        if isinstance(ev, ReasoningDelta):
            if self.block != "thinking":
                out += self._open("thinking", {"type": "thinking", "thinking": "", "signature": ""})
            out.append(
                self._ev(
                    "content_block_delta",
                    {"index": self.index, "delta": {"type": "thinking_delta", "thinking": ev.text}},
                )
            )
        elif isinstance(ev, TextDelta):
            if self.block != "text":
                out += self._open("text", {"type": "text", "text": ""})
            out.append(
                self._ev(
                    "content_block_delta",
                    {"index": self.index, "delta": {"type": "text_delta", "text": ev.text}},
                )
            )
        elif isinstance(ev, ToolCallStart):
            out += self._open(
                "tool_use", {"type": "tool_use", "id": ev.id, "name": ev.name, "input": {}}
            )
        elif isinstance(ev, ToolCallArgsDelta):
            out.append(
                self._ev(
                    "content_block_delta",
                    {
                        "index": self.index,
                        "delta": {"type": "input_json_delta", "partial_json": ev.text},
                    },
                )
            )
        elif isinstance(ev, ToolCallEnd):
            out += self._close()
        elif isinstance(ev, Finish):
            out += self._close()
            if not self.any_block:
                out += self._open("text", {"type": "text", "text": ""})
                out += self._close()
            reason, seq = stop_reason(ev)
            u = self.usage or Usage(0, 0)
            out.append(
                self._ev(
                    "message_delta",
                    {
                        "delta": {"stop_reason": reason, "stop_sequence": seq},
                        "usage": usage_json(u, self.req),
                    },
                )
            )
            out.append(self._ev("message_stop", {}))
        return out

    def error(self, err: ApiError) -> list[str]:
        return [sse(error_body(err), "error")]
