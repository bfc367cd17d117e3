"""Ollama's native API (POST /api/chat, POST /api/generate): request JSON <-> neutral
request, events -> NDJSON lines or one JSON body, errors as {"error": "..."}.

What the editors' Ollama providers parse (Continue, Zed, VS Code Copilot, Open WebUI and
the official `ollama` client): one JSON object per line, `done: false` while generating,
then a final object with `done_reason` and the timing fields in nanoseconds. A tool call
comes whole in one line with its `arguments` as an object (Ollama never streams
arguments). The daemon side (which model, when it is loaded, how long the request took)
comes in through `Timings`; this module only translates.
"""

from __future__ import annotations

import hashlib
import json
import math
import re
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime, timezone
from typing import Any

from ds4d.api.common import (
    ApiError,
    Completion,
    bad,
    field_of,
    objects_of,
    request_object,
    sampling_of,
    steering_of,
    stop_list,
)
from ds4d.api.openai_chat import parse_tools
from ds4d.api.output_format import ollama_format
from ds4d.chat.fim import InfillInput, supersede_key
from ds4d.chat.types import (
    ChatRequest,
    Event,
    Finish,
    Message,
    OutputFormat,
    ReasoningDelta,
    Role,
    Sampling,
    TextDelta,
    ToolCall,
    ToolCallEnd,
    ToolCallStart,
    Usage,
)

# The version /api/version reports: clients gate features on it (VS Code Copilot asks for
# at least 0.6.4), so it is an Ollama release whose API this module speaks.
OLLAMA_VERSION = "0.12.6"

ROLES: dict[str, Role] = {"system": "system", "user": "user", "assistant": "assistant",
                          "tool": "tool"}  # fmt: skip

# Options that tune how Ollama runs a model (threads, GPU layers, batching, memory
# mapping), not what it writes: ds4d decides those itself, so they are accepted and ignored.
_RUNNER_OPTIONS = frozenset(
    {"numa", "num_batch", "num_gpu", "main_gpu", "low_vram", "f16_kv", "logits_all",
     "vocab_only", "use_mmap", "use_mlock", "embedding_only", "num_thread", "num_keep",
     "num_gqa"}
)  # fmt: skip
# Sampling options ds4d's sampler does not have, with the value that leaves sampling as it
# is: sent with that value they are accepted, with any other refused by name.
_NEUTRAL_OPTIONS: dict[str, float] = {
    "repeat_penalty": 1.0,
    "presence_penalty": 0.0,
    "frequency_penalty": 0.0,
    "typical_p": 1.0,
    "tfs_z": 1.0,
    "mirostat": 0,
}
# Parameters of the options above, meaningless while those are neutral.
_DEPENDENT_OPTIONS = frozenset({"repeat_last_n", "mirostat_tau", "mirostat_eta",
                                "penalize_newline"})  # fmt: skip
_SAMPLING_OPTIONS = frozenset({"temperature", "top_k", "top_p", "min_p", "seed", "speculative"})


@dataclass
class OllamaRequest:
    """An Ollama request: the neutral request plus what only the daemon acts on."""

    request: ChatRequest
    keep_alive_s: float | None = None  # None: the daemon's default; < 0: forever
    num_ctx: int | None = None  # a limit for this request, inside the loaded context
    load_only: bool = False  # no messages / empty prompt: load (or unload) the model
    suffix: str | None = None  # /api/generate: fill in the middle between prompt and this
    prompt: str = ""  # /api/generate's prompt as sent (the FIM prefix)


@dataclass
class Timings:
    """What the final object reports, in nanoseconds (the daemon measures them)."""

    total_ns: int = 0
    load_ns: int = 0
    prompt_eval_ns: int = 0
    eval_ns: int = 0


def error_body(err: ApiError) -> dict[str, Any]:
    return {"error": err.message}


def model_name(body: dict[str, Any]) -> str:
    """`model`, or `name` as older clients (Continue's /api/show) send it."""
    name = field_of(body, "model", str, None)
    if name is None:
        name = field_of(body, "name", str, "")
    return str(name)


# ---- requests ---------------------------------------------------------------------------

_DURATION = re.compile(r"(-?\d+(?:\.\d+)?)(ns|us|µs|ms|s|m|h)")
_UNIT_S = {"ns": 1e-9, "us": 1e-6, "µs": 1e-6, "ms": 1e-3, "s": 1.0, "m": 60.0, "h": 3600.0}


def keep_alive_seconds(value: Any) -> float | None:
    """Ollama's keep_alive: seconds as a number, or a Go duration ("5m", "1h30m", "-1s");
    negative keeps the model loaded for good, 0 unloads it once the request is done."""
    if value is None:
        return None
    if isinstance(value, bool):
        raise bad("'keep_alive' must be a number of seconds or a duration such as \"5m\"")
    if isinstance(value, int | float):
        if not math.isfinite(value):
            raise bad("'keep_alive' must be finite")
        return float(value)
    if isinstance(value, str):
        text = value.strip()
        if re.fullmatch(r"-?\d+(\.\d+)?", text):
            return float(text)
        parts = _DURATION.findall(text)
        if parts and "".join(n + u for n, u in parts) == text:
            return sum(float(n) * _UNIT_S[u] for n, u in parts)
    raise bad("'keep_alive' must be a number of seconds or a duration such as \"5m\"")


def _options(body: dict[str, Any], defaults: Sampling) -> tuple[dict[str, Any], Sampling]:
    options: dict[str, Any] = field_of(body, "options", dict, {})
    for key, value in options.items():
        if value is None or key in _RUNNER_OPTIONS or key in _DEPENDENT_OPTIONS:
            continue
        if key in _NEUTRAL_OPTIONS:
            if value != _NEUTRAL_OPTIONS[key]:
                raise bad(
                    f"'options.{key}' is not supported (ds4d samples with temperature, "
                    "top_k, top_p, min_p and seed); leave it out",
                    f"options.{key}",
                )
            continue
        if key not in _SAMPLING_OPTIONS | {"num_predict", "num_ctx", "stop", "steering"}:
            raise bad(f"'options.{key}' is not an option ds4d knows", f"options.{key}")
    sampled = {k: v for k, v in options.items() if k in _SAMPLING_OPTIONS}
    seed = sampled.get("seed")
    if isinstance(seed, int) and not isinstance(seed, bool) and seed < 0:
        del sampled["seed"]  # Ollama's -1: a random seed
    return options, sampling_of(sampled, defaults, max_temperature=100.0)


def _num_predict(options: dict[str, Any]) -> int | None:
    value: int | None = field_of(options, "num_predict", int, None, where="options")
    if value is None or value in (-1, -2):  # -1: no limit, -2: until the context is full
        return None
    if value < 1:
        raise bad("'options.num_predict' must be -1, -2 or at least 1", "options.num_predict")
    return value


def _num_ctx(options: dict[str, Any]) -> int | None:
    value: int | None = field_of(options, "num_ctx", int, None, where="options")
    if value is not None and value < 1:
        raise bad("'options.num_ctx' must be at least 1", "options.num_ctx")
    return value


def think_switch(value: Any) -> tuple[bool | None, str | None]:
    """Ollama's `think`: true/false, or a level ("low", "medium", "high") that turns
    thinking on at that effort. Returns (thinking, reasoning_effort)."""
    if value is None:
        return None, None
    if isinstance(value, bool):
        return value, None
    if value in ("low", "medium", "high"):
        return True, str(value)
    raise bad('\'think\' must be true, false, "low", "medium" or "high"', "think")


def _refuse_images(images: Any, where: str) -> None:
    if images:
        raise bad(f"'{where}': this model reads text only; images are not supported", where)


def _call_id(message_index: int, call_index: int) -> str:
    """Ollama clients send past calls without ids; a stable id per position keeps the
    rendered history (and so its KV prefix) the same on every turn."""
    digest = hashlib.sha256(f"{message_index}/{call_index}".encode()).hexdigest()[:12]
    return f"call_{digest}"


def _messages(value: Any) -> list[Message]:
    out: list[Message] = []
    last_calls: list[ToolCall] = []
    answered: set[str] = set()  # ids of last_calls whose result has been seen
    for n, m in objects_of(value, "messages", param="messages"):
        where = f"messages[{n}]"
        role = field_of(m, "role", str, where=where, required=True)
        if role not in ROLES:
            raise bad(f"'{where}.role' must be one of {', '.join(ROLES)}", "messages")
        _refuse_images(m.get("images"), f"{where}.images")
        msg = Message(ROLES[role], field_of(m, "content", str, "", where=where))
        thinking = field_of(m, "thinking", str, "", where=where)
        if thinking:
            msg.reasoning = thinking
        for k, call in objects_of(m.get("tool_calls"), "tool_calls", param="messages"):
            fn = call.get("function")
            if not isinstance(fn, dict):
                raise bad(f"'{where}.tool_calls[{k}].function' must be an object", "messages")
            cwhere = f"{where}.tool_calls[{k}].function"
            name = field_of(fn, "name", str, where=cwhere, required=True)
            args = fn.get("arguments")
            if args is None:
                args = {}
            if isinstance(args, str):  # some clients send the JSON text
                try:
                    args = json.loads(args)
                except ValueError:
                    raise bad(f"'{cwhere}.arguments' must be an object", "messages") from None
            if not isinstance(args, dict):
                raise bad(f"'{cwhere}.arguments' must be an object", "messages")
            call_id = field_of(call, "id", str, None, where=f"{where}.tool_calls[{k}]")
            msg.tool_calls.append(
                ToolCall(
                    call_id or _call_id(n, k),
                    name,
                    json.dumps(args, ensure_ascii=False, separators=(",", ":")),
                )
            )
        if msg.tool_calls:
            last_calls, answered = msg.tool_calls, set()
        if msg.role == "tool":
            name = field_of(m, "tool_name", str, None, where=where) or field_of(
                m, "name", str, None, where=where
            )
            msg.name = name
            msg.tool_call_id = field_of(m, "tool_call_id", str, None, where=where)
            if msg.tool_call_id is None and last_calls:
                # Results carry only the tool's name: the first unanswered call of that
                # name, else the next call in order.
                pending = [c for c in last_calls if c.id not in answered]
                match = next((c for c in pending if c.name == name), None) or (
                    pending[0] if pending else last_calls[-1]
                )
                msg.tool_call_id = match.id
                answered.add(match.id)
        out.append(msg)
    return out


def parse_chat(body: Any, defaults: Sampling) -> OllamaRequest:
    """POST /api/chat."""
    body = request_object(body)
    output_format = ollama_format(body)
    options, sampling = _options(body, defaults)
    messages = _messages(body.get("messages"))
    think = think_switch(body.get("think"))
    tools = parse_tools(body.get("tools"))
    req = _chat_request(body, options, sampling, messages, think, output_format, tools=tools)
    return OllamaRequest(
        req,
        keep_alive_s=keep_alive_seconds(body.get("keep_alive")),
        num_ctx=_num_ctx(options),
        load_only=not messages,
    )


def _chat_request(
    body: dict[str, Any],
    options: dict[str, Any],
    sampling: Sampling,
    messages: list[Message],
    think: tuple[bool | None, str | None],
    output_format: OutputFormat | None,
    **fields: Any,
) -> ChatRequest:
    """The request of /api/chat and /api/generate: what both read from the body and its
    options (checked in this order, after what the caller checked), and the route's own
    `fields`."""
    thinking, effort = think
    return ChatRequest(
        messages=messages,
        sampling=sampling,
        max_tokens=_num_predict(options),
        stop=stop_list(options.get("stop"), "options.stop"),
        thinking=thinking,
        reasoning_effort=effort,
        model=model_name(body),
        stream=field_of(body, "stream", bool, True),  # Ollama streams unless told not to
        output_format=output_format,
        steering=steering_of(options.get("steering"), "options.steering"),
        **fields,
    )


def parse_generate(body: Any, defaults: Sampling) -> OllamaRequest:
    """POST /api/generate: a prompt through the chat template (or `raw`), or with a
    `suffix` the fill-in-the-middle path."""
    body = request_object(body)
    output_format = ollama_format(body)
    _refuse_images(body.get("images"), "images")
    if body.get("context"):
        raise bad("'context' (token history of an earlier reply) is not supported", "context")
    if field_of(body, "template", str, ""):
        raise bad("'template' overrides are not supported; the model's own is used", "template")
    options, sampling = _options(body, defaults)
    prompt = field_of(body, "prompt", str, "")
    suffix = field_of(body, "suffix", str, None)
    system = field_of(body, "system", str, "")
    raw = field_of(body, "raw", bool, False)
    think = think_switch(body.get("think"))
    messages = [Message("system", system)] if system else []
    messages.append(Message("user", prompt))
    req = _chat_request(body, options, sampling, messages, think, output_format,
                        raw_prompt=prompt if raw else None)  # fmt: skip
    if suffix is not None and output_format is not None:
        raise bad("'format' cannot be combined with 'suffix' (fill in the middle)", "format")
    if suffix is not None:  # an editor's inline completion: fill in the middle
        req.fim = InfillInput(prompt, suffix)
        req.raw_prompt = prompt  # its output is plain text, not a chat turn
        req.priority = "completion"  # someone is waiting
        req.supersede_key = supersede_key(prompt)  # a newer keystroke replaces it
    return OllamaRequest(
        req,
        keep_alive_s=keep_alive_seconds(body.get("keep_alive")),
        num_ctx=_num_ctx(options),
        load_only=not prompt and not suffix,
        suffix=suffix,
        prompt=prompt,
    )


# ---- responses --------------------------------------------------------------------------


def created_at(now: datetime) -> str:
    """RFC 3339 in UTC with a `Z`, as Ollama writes it."""
    return now.astimezone(timezone.utc).isoformat().replace("+00:00", "Z")


def done_reason(finish: Finish) -> str:
    return "length" if finish.reason == "length" else "stop"


def _stats(finish: Finish, usage: Usage, t: Timings) -> dict[str, Any]:
    # prompt_eval_count counts the prompt tokens evaluated for this request: tokens
    # reused from a cached prefix cost nothing and are not counted (as in Ollama).
    return {
        "done_reason": done_reason(finish),
        "total_duration": t.total_ns,
        "load_duration": t.load_ns,
        "prompt_eval_count": usage.uncached_tokens,
        "prompt_eval_duration": t.prompt_eval_ns,
        "eval_count": usage.completion_tokens,
        "eval_duration": t.eval_ns,
    }


def _tool_call_json(call: ToolCall, index: int) -> dict[str, Any]:
    try:
        args = json.loads(call.arguments) if call.arguments.strip() else {}
    except ValueError:
        args = {}
    return {"id": call.id, "function": {"index": index, "name": call.name, "arguments": args}}


def done_object(model: str, now: datetime, chat: bool, reason: str) -> dict[str, Any]:
    """The answer to a request without a prompt: `reason` "load" or "unload"."""
    head: dict[str, Any] = {"model": model, "created_at": created_at(now)}
    if chat:
        head["message"] = {"role": "assistant", "content": ""}
    else:
        head["response"] = ""
    return {**head, "done": True, "done_reason": reason}


def chat_response(c: Completion, model: str, now: datetime, timings: Timings) -> dict[str, Any]:
    message: dict[str, Any] = {"role": "assistant", "content": c.text}
    if c.reasoning:
        message["thinking"] = c.reasoning
    if c.tool_calls:
        message["tool_calls"] = [_tool_call_json(t, i) for i, t in enumerate(c.tool_calls)]
    return {
        "model": model,
        "created_at": created_at(now),
        "message": message,
        "done": True,
        **_stats(c.finish, c.usage, timings),
    }


def generate_response(c: Completion, model: str, now: datetime, timings: Timings) -> dict[str, Any]:
    out: dict[str, Any] = {"model": model, "created_at": created_at(now), "response": c.text}
    if c.reasoning:
        out["thinking"] = c.reasoning
    return {**out, "done": True, **_stats(c.finish, c.usage, timings)}


@dataclass
class Stream:
    """One streamed reply as NDJSON lines (/api/chat when `chat`, else /api/generate).
    `timings` is asked once, when the generation has finished; `clock` stamps each line."""

    model: str
    chat: bool
    timings: Callable[[], Timings]
    clock: Callable[[], datetime] = field(default=lambda: datetime.now(timezone.utc))
    usage: Usage = field(default_factory=lambda: Usage(0, 0))
    calls: list[ToolCall] = field(default_factory=list)

    def _line(self, fields: dict[str, Any]) -> str:
        obj = {"model": self.model, "created_at": created_at(self.clock()), **fields}
        return json.dumps(obj, ensure_ascii=False) + "\n"

    def _piece(self, text: str = "", thinking: str | None = None, **extra: Any) -> str:
        if self.chat:
            message: dict[str, Any] = {"role": "assistant", "content": text}
            if thinking is not None:
                message["thinking"] = thinking
            message.update(extra)
            return self._line({"message": message, "done": False})
        fields: dict[str, Any] = {"response": text}
        if thinking is not None:
            fields["thinking"] = thinking
        return self._line({**fields, "done": False})

    def feed(self, ev: Event) -> list[str]:
        if isinstance(ev, TextDelta):
            return [self._piece(ev.text)] if ev.text else []
        if isinstance(ev, ReasoningDelta):
            return [self._piece("", ev.text)] if ev.text else []
        if isinstance(ev, ToolCallStart):
            self.calls.append(ToolCall(ev.id, ev.name, ""))
            return []
        if isinstance(ev, ToolCallEnd):
            call = self.calls[ev.index]
            call.arguments = ev.arguments
            if not self.chat:
                return []
            return [self._piece("", tool_calls=[_tool_call_json(call, ev.index)])]
        if isinstance(ev, Usage):
            self.usage = ev
            return []
        if isinstance(ev, Finish):
            if ev.reason == "error":
                return [json.dumps({"error": ev.error or "generation failed"}) + "\n"]
            last: dict[str, Any] = (
                {"message": {"role": "assistant", "content": ""}} if self.chat else {"response": ""}
            )
            return [self._line({**last, "done": True, **_stats(ev, self.usage, self.timings())})]
        return []

    def error(self, err: ApiError) -> list[str]:
        return [json.dumps(error_body(err)) + "\n"]
