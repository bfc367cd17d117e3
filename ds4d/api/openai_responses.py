"""POST /v1/responses: OpenAI Responses (stateless: the client replays the full input)."""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any

from ds4d.api.common import (
    ApiError,
    Completion,
    bad,
    content_text,
    effort_thinking,
    field_of,
    json_text,
    max_tokens_of,
    objects_of,
    random_id,
    request_object,
    sampling_of,
    sse,
    steering_of,
)
from ds4d.api.openai_chat import error_body
from ds4d.api.openai_chat import parse_tool_choice as _chat_tool_choice
from ds4d.api.output_format import responses_text_format
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
    ToolCallEnd,
    ToolCallStart,
    Usage,
)

__all__ = ["error_body", "parse", "response", "Stream"]

TEXT_PARTS = ("input_text", "output_text", "text", "summary_text", "reasoning_text", "refusal")
ROLES: dict[str, Role] = {
    "user": "user",
    "assistant": "assistant",
    "system": "system",
    "developer": "system",
}
CALL_ITEMS = {"function_call", "custom_tool_call", "local_shell_call"}
OUTPUT_ITEMS = {"function_call_output", "custom_tool_call_output", "local_shell_call_output"}


@dataclass
class ResponsesRequest(ChatRequest):
    """A chat request plus what a Responses reply must give back to its client."""

    tool_namespaces: dict[str, str] = field(default_factory=dict)  # tool name -> namespace
    tools_json: list[Any] = field(default_factory=list)  # `tools` as sent, echoed back
    tool_choice_json: Any = "auto"  # `tool_choice` as sent, echoed back
    client_limit: bool = False  # the client set max_output_tokens


def parse_tools(value: Any) -> tuple[list[Tool], dict[str, str]]:
    """Function tools, with the functions of `namespace` tools (Codex groups some tools
    so) flattened: the model calls them by their own name, and the reply's call item
    names the namespace again. Also returns {tool name: namespace}."""
    tools: list[Tool] = []
    namespaces: dict[str, str] = {}
    for n, t in objects_of(value, "tools", param="tools"):
        kind = t.get("type")
        namespace = None
        if kind == "namespace":
            namespace = field_of(t, "name", str, where=f"tools[{n}]", required=True)
        inner = t.get("tools") if kind == "namespace" else [t]
        if not isinstance(inner, list):
            raise bad(f"'tools[{n}].tools' must be an array", "tools")
        for k, fn in enumerate(inner):
            where = f"tools[{n}].tools[{k}]" if namespace is not None else f"tools[{n}]"
            if not isinstance(fn, dict) or fn.get("type", "function") != "function":
                continue  # hosted tools (web_search, file_search...) have no local body
            name = field_of(fn, "name", str, where=where, required=True)
            params = field_of(
                fn, "parameters", dict, {"type": "object", "properties": {}}, where=where
            )
            if namespace is not None:
                namespaces.setdefault(name, namespace)
            tools.append(Tool(name, field_of(fn, "description", str, "", where=where), params))
    return tools, namespaces


def _input(value: Any, instructions: str) -> list[Message]:
    messages: list[Message] = []
    if instructions:
        messages.append(Message("system", instructions))
    if isinstance(value, str):
        messages.append(Message("user", value))
        return messages
    if not isinstance(value, list):
        raise bad("'input' must be a string or an array of items", "input")
    pending_reasoning = ""
    for n, item in enumerate(value):
        where = f"input[{n}]"
        if not isinstance(item, dict):
            raise bad(f"'{where}' must be an object", "input")
        kind = item.get("type", "message")
        if kind == "message":
            role = field_of(item, "role", str, where=where, required=True)
            if role not in ROLES:
                raise bad(f"'{where}.role' must be one of {', '.join(ROLES)}", "input")
            msg = Message(
                ROLES[role], content_text(item.get("content"), f"{where}.content", TEXT_PARTS)
            )
            if msg.role == "assistant" and pending_reasoning:
                msg.reasoning, pending_reasoning = pending_reasoning, ""
            messages.append(msg)
        elif kind == "reasoning":
            summary = item.get("summary") or []
            if isinstance(summary, list):
                pending_reasoning += "".join(
                    s.get("text", "") for s in summary if isinstance(s, dict)
                )
        elif kind in CALL_ITEMS:
            name = item.get("name") or ("local_shell" if kind == "local_shell_call" else None)
            if not isinstance(name, str):
                raise bad(f"'{where}.name' is required", "input")
            call_id = item.get("call_id") or item.get("id")
            if not isinstance(call_id, str):
                raise bad(f"'{where}.call_id' is required", "input")
            args = item.get("arguments", item.get("input", item.get("action")))
            call = ToolCall(call_id, name, json_text(args, f"{where}.arguments"))
            last = messages[-1] if messages else None
            if last is None or last.role != "assistant":
                last = Message("assistant")
                messages.append(last)
            if pending_reasoning and not last.reasoning:
                last.reasoning, pending_reasoning = pending_reasoning, ""
            last.tool_calls.append(call)
        elif kind in OUTPUT_ITEMS:
            call_id = item.get("call_id") or item.get("id")
            if not isinstance(call_id, str):
                raise bad(f"'{where}.call_id' must be the string id of the call", "input")
            output = item.get("output")
            text = (
                output
                if isinstance(output, str)
                else content_text(
                    output if isinstance(output, list) else None, f"{where}.output", TEXT_PARTS
                )
            )
            messages.append(Message("tool", text, tool_call_id=call_id))
        # item_reference, compaction, web_search_call...: nothing to render
    if not any(m.role != "system" for m in messages):
        raise bad("'input' must hold at least one message", "input")
    return messages


def parse(body: Any, defaults: Sampling) -> ChatRequest:
    body = request_object(body)
    if body.get("previous_response_id") is not None or body.get("conversation") is not None:
        raise bad(
            "previous_response_id is not supported; replay the full input instead",
            "previous_response_id",
        )
    if "input" not in body or body["input"] is None:
        raise bad("'input' is required", "input")
    instructions = field_of(body, "instructions", str, "")
    messages = _input(body["input"], instructions)
    tools, namespaces = parse_tools(body.get("tools"))
    reasoning = field_of(body, "reasoning", dict, {})
    req = ResponsesRequest(
        messages=messages,
        tools=tools,
        tool_choice=_chat_tool_choice(body.get("tool_choice"), tools),
        sampling=sampling_of(body, defaults),
        max_tokens=max_tokens_of(body, "max_output_tokens", "max_tokens"),
        thinking=effort_thinking(reasoning.get("effort"), "reasoning.effort"),
        reasoning_effort=reasoning.get("effort"),
        model=field_of(body, "model", str, ""),
        stream=field_of(body, "stream", bool, False),
        tool_namespaces=namespaces,
        tools_json=body.get("tools") or [],
        tool_choice_json=body["tool_choice"] if body.get("tool_choice") is not None else "auto",
        output_format=responses_text_format(body),
        steering=steering_of(body.get("steering")),
    )
    req.client_limit = req.max_tokens is not None
    return req


def usage_json(u: Usage) -> dict[str, Any]:
    return {
        "input_tokens": u.prompt_tokens,
        "input_tokens_details": {"cached_tokens": u.cached_tokens},
        "output_tokens": u.completion_tokens,
        "output_tokens_details": {"reasoning_tokens": 0},
        "total_tokens": u.prompt_tokens + u.completion_tokens,
    }


def _status(f: Finish, req: ChatRequest) -> str:
    """`incomplete` when the client's own max_output_tokens ran out. A request that set
    none was cut by ds4d's default answer cap, a server policy the client never asked
    about: that response is `completed` (its message item still `incomplete`). Codex,
    which sends no limit, takes `response.incomplete` as a failed turn and retries it,
    generating the whole answer again each time."""
    if f.reason == "length":
        limited = isinstance(req, ResponsesRequest) and req.client_limit
        return "incomplete" if limited else "completed"
    return "failed" if f.reason == "error" else "completed"


def _item_status(f: Finish) -> str:
    """An output item cut short (token limit, failure) is `incomplete`, as OpenAI's are."""
    return "incomplete" if f.reason in ("length", "error") else "completed"


class _Builder:
    """Output items of one response, shared by the streaming and the plain paths."""

    def __init__(self, req: ChatRequest, model: str) -> None:
        self.id = random_id("resp_")
        self.created = int(time.time())
        self.model = model
        self.output: list[dict[str, Any]] = []
        self.namespaces = req.tool_namespaces if isinstance(req, ResponsesRequest) else {}
        self.tools = req.tools_json if isinstance(req, ResponsesRequest) else []
        self.tool_choice = req.tool_choice_json if isinstance(req, ResponsesRequest) else "auto"

    def call_item(
        self, item_id: str, call_id: str, name: str, arguments: str, status: str
    ) -> dict[str, Any]:
        item = {
            "id": item_id,
            "type": "function_call",
            "status": status,
            "call_id": call_id,
            "name": name,
            "arguments": arguments,
        }
        if name in self.namespaces:
            item["namespace"] = self.namespaces[name]
        return item

    def envelope(
        self, status: str, finish: Finish | None = None, usage: Usage | None = None
    ) -> dict[str, Any]:
        obj: dict[str, Any] = {
            "id": self.id,
            "object": "response",
            "created_at": self.created,
            "status": status,
            "model": self.model,
            "output": self.output,
            "error": None,
            "incomplete_details": None,
            "instructions": None,
            "parallel_tool_calls": True,
            "tool_choice": self.tool_choice,
            "tools": self.tools,
        }
        if finish is not None and finish.reason == "length" and status == "incomplete":
            obj["incomplete_details"] = {"reason": "max_output_tokens"}
        if finish is not None and finish.reason == "error":
            obj["error"] = {"code": "server_error", "message": finish.error or "generation failed"}
        if usage is not None:
            obj["usage"] = usage_json(usage)
        return obj


@dataclass(frozen=True)
class _TextItem:
    """An output item of text, as Responses writes it whole and streams it: the assistant's
    message (its `content`, one output_text part) or its reasoning (its `summary`, one
    summary_text part). Their events have the same shape under their own names; a
    message's part has annotations, its role is assistant and its text events carry
    logprobs."""

    type: str
    id_prefix: str
    parts: str  # the item's list of parts
    index: str  # the events' index of the part
    part_type: str
    text_events: str  # `<text_events>.delta` / `.done`
    part_events: str  # `<part_events>.added` / `.done`

    def item(self, item_id: str, status: str, parts: list[dict[str, Any]]) -> dict[str, Any]:
        role = {"role": "assistant"} if self.type == "message" else {}
        return {"id": item_id, "type": self.type, "status": status, **role, self.parts: parts}

    def part(self, text: str) -> dict[str, Any]:
        notes: dict[str, Any] = {"annotations": []} if self.type == "message" else {}
        return {"type": self.part_type, "text": text, **notes}

    def whole(self, text: str, status: str) -> dict[str, Any]:
        """The item of a response that is not streamed."""
        return self.item(random_id(self.id_prefix), status, [self.part(text)])

    def text_extra(self) -> dict[str, Any]:
        return {"logprobs": []} if self.type == "message" else {}


_MESSAGE = _TextItem(
    "message", "msg_", "content", "content_index", "output_text",
    "response.output_text", "response.content_part",
)  # fmt: skip
_REASONING = _TextItem(
    "reasoning", "rs_", "summary", "summary_index", "summary_text",
    "response.reasoning_summary_text", "response.reasoning_summary_part",
)  # fmt: skip
_TEXT_ITEMS = {k.type: k for k in (_MESSAGE, _REASONING)}


def response(req: ChatRequest, c: Completion, model: str) -> dict[str, Any]:
    b = _Builder(req, model)
    status = _status(c.finish, req)
    if c.reasoning:
        b.output.append(_REASONING.whole(c.reasoning, "completed"))
    if c.text:
        b.output.append(_MESSAGE.whole(c.text, _item_status(c.finish)))
    for call in c.tool_calls:
        b.output.append(
            b.call_item(random_id("fc_"), call.id, call.name, call.arguments, "completed")
        )
    return b.envelope(status, c.finish, c.usage)


class Stream:
    """response.created / in_progress, one item per output (reasoning, message, function
    calls) with added / delta / done events, then completed, incomplete or failed."""

    def __init__(self, req: ChatRequest, model: str) -> None:
        self.req = req
        self.b = _Builder(req, model)
        self.seq = 0
        self.item: dict[str, Any] | None = None  # the open output item
        self.text = ""
        self.usage: Usage | None = None
        self.calls: dict[int, ToolCall] = {}

    def _ev(self, kind: str, **data: Any) -> str:
        ev = {"type": kind, "sequence_number": self.seq, **data}
        self.seq += 1
        return sse(ev, kind)

    def open(self) -> list[str]:
        env = self.b.envelope("in_progress")
        return [
            self._ev("response.created", response=env),
            self._ev("response.in_progress", response=env),
        ]

    def keepalive(self) -> str:
        """`response.in_progress` again, as the response stands: Codex (and other
        clients built on an SSE event reader) drop a stream after a while without an
        event, and SSE comments are no events to them; the openai SDK takes a repeated
        lifecycle event of the same response as a snapshot update."""
        return self._ev("response.in_progress", response=self.b.envelope("in_progress"))

    @property
    def _index(self) -> int:
        return len(self.b.output) - 1

    def _at(self, text_item: _TextItem, item: dict[str, Any]) -> dict[str, Any]:
        """Where a text item's part events are: the item, its index, the part's (0)."""
        return {"item_id": item["id"], "output_index": self._index, text_item.index: 0}

    def _close(self, status: str = "completed") -> list[str]:
        item, self.item = self.item, None
        if item is None:
            return []
        i, text = self._index, self.text
        text_item = _TEXT_ITEMS.get(item["type"])
        if text_item is not None:
            part = text_item.part(text)
            item[text_item.parts] = [part]
            item["status"] = status
            at = self._at(text_item, item)
            return [
                self._ev(
                    f"{text_item.text_events}.done", **at, text=text, **text_item.text_extra()
                ),
                self._ev(f"{text_item.part_events}.done", **at, part=part),
                self._ev("response.output_item.done", output_index=i, item=item),
            ]
        item["status"] = status
        return [
            self._ev(
                "response.function_call_arguments.done",
                item_id=item["id"],
                output_index=i,
                name=item["name"],
                arguments=item["arguments"],
            ),
            self._ev("response.output_item.done", output_index=i, item=item),
        ]

    def _open(self, item: dict[str, Any]) -> list[str]:
        out = self._close()
        self.item = item
        self.text = ""
        self.b.output.append(item)
        out.append(
            self._ev("response.output_item.added", output_index=self._index, item=dict(item))
        )
        return out

    def feed(self, ev: Event) -> list[str]:
        out: list[str] = []
        if isinstance(ev, (ReasoningDelta, TextDelta)):
            text_item = _REASONING if isinstance(ev, ReasoningDelta) else _MESSAGE
            if self.item is None or self.item["type"] != text_item.type:
                item = text_item.item(random_id(text_item.id_prefix), "in_progress", [])
                out += self._open(item)
                out.append(self._ev(f"{text_item.part_events}.added", **self._at(text_item, item),
                                    part=text_item.part("")))  # fmt: skip
            assert self.item is not None  # opened just above if it was not
            self.text += ev.text
            out.append(self._ev(f"{text_item.text_events}.delta", **self._at(text_item, self.item),
                                delta=ev.text, **text_item.text_extra()))  # fmt: skip
        elif isinstance(ev, ToolCallStart):
            out += self._open(self.b.call_item(random_id("fc_"), ev.id, ev.name, "", "in_progress"))
        elif isinstance(ev, ToolCallArgsDelta) and self.item is not None:
            self.item["arguments"] += ev.text
            out.append(
                self._ev(
                    "response.function_call_arguments.delta",
                    item_id=self.item["id"],
                    output_index=self._index,
                    delta=ev.text,
                )
            )
        elif isinstance(ev, ToolCallEnd) and self.item is not None:
            self.item["arguments"] = ev.arguments
            out += self._close()
        elif isinstance(ev, Usage):
            self.usage = ev
        elif isinstance(ev, Finish):
            out += self._close(_item_status(ev))
            status = _status(ev, self.req)
            kind = {
                "completed": "response.completed",
                "incomplete": "response.incomplete",
                "failed": "response.failed",
            }[status]
            out.append(self._ev(kind, response=self.b.envelope(status, ev, self.usage)))
        return out

    def error(self, err: ApiError) -> list[str]:
        return [self._ev("error", code=err.code or err.kind, message=err.message, param=err.param)]
