"""What the four protocol modules share: request validation helpers, the error type,
collecting events into a complete reply, and SSE framing."""

from __future__ import annotations

import json
import secrets
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Protocol

from ds4d.chat.errors import (
    ContextExceeded,
    Overloaded,
    PromptRefused,
    Refused,
    Unavailable,
    UnknownModel,
)
from ds4d.chat.types import (
    ChatRequest,
    Event,
    Finish,
    ReasoningDelta,
    Sampling,
    SteeringChoice,
    TextDelta,
    ToolCall,
    ToolCallEnd,
    ToolCallStart,
    ToolChoice,
    Usage,
)


class ApiError(Exception):
    """A request the server refuses; each protocol renders it in its own error shape."""

    def __init__(
        self,
        status: int,
        message: str,
        *,
        kind: str = "invalid_request_error",
        param: str | None = None,
        code: str | None = None,
        extra: dict[str, Any] | None = None,
        headers: dict[str, str] | None = None,
    ) -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.kind = kind
        self.param = param
        self.code = code
        self.extra = extra or {}
        self.headers = headers or {}


class EventStream(Protocol):
    """One streamed response in a protocol's SSE framing (each module's `Stream`)."""

    def open(self) -> list[str]:
        """What is sent before the first event."""
        ...

    def feed(self, ev: Event) -> list[str]: ...

    def keepalive(self) -> str:
        """Sent when nothing happened for a while (a long prefill, the queue)."""
        ...

    def error(self, err: ApiError) -> list[str]: ...


class ApiProtocol(Protocol):
    """A protocol module (openai_chat, openai_completions, openai_responses,
    anthropic_messages), as the daemon's routes use it."""

    def parse(self, body: Any, defaults: Sampling) -> ChatRequest:
        """The request JSON as a neutral request (ApiError for anything malformed)."""
        ...

    def response(self, req: ChatRequest, c: Completion, model: str) -> dict[str, Any]:
        """The non-streaming response body."""
        ...

    def error_body(self, err: ApiError) -> dict[str, Any]: ...

    @property
    def Stream(self) -> Callable[[ChatRequest, str], EventStream]:  # noqa: N802 - the class
        ...


def bad(message: str, param: str | None = None) -> ApiError:
    return ApiError(400, message, param=param)


def refusal_error(err: Refused) -> ApiError:
    """The HTTP error for a refusal raised below the API layer (ds4d.chat.errors): bad
    prompts are 400s, a full queue and an unready server 503s with Retry-After."""
    if isinstance(err, ContextExceeded):
        return ApiError(
            400,
            err.message,
            param=err.param,
            code="context_length_exceeded",
            extra={f"n_prompt_{err.unit}": err.size, "n_ctx": err.n_ctx},
        )
    if isinstance(err, PromptRefused):
        return ApiError(400, err.message, param=err.param)
    if isinstance(err, Overloaded):
        return ApiError(
            503,
            err.message,
            kind="server_error",
            code="overloaded",
            headers={"Retry-After": str(err.retry_after_s)},
        )
    if isinstance(err, UnknownModel):
        return ApiError(404, err.message, param="model", code="model_not_found")
    if isinstance(err, Unavailable):
        retry = {"Retry-After": str(err.retry_after_s)} if err.retry_after_s else None
        return ApiError(503, err.message, kind="server_error", headers=retry)
    return ApiError(500, "internal error (details are in the server log)", kind="server_error")


def random_id(prefix: str, nbytes: int = 12) -> str:
    return prefix + secrets.token_hex(nbytes)


# ---- validation ------------------------------------------------------------------------

_TYPE_NAMES = {
    str: "a string",
    bool: "a boolean",
    int: "an integer",
    float: "a number",
    list: "an array",
    dict: "an object",
}


def request_object(body: Any) -> dict[str, Any]:
    """The parsed request body, which must be a JSON object."""
    if not isinstance(body, dict):
        raise bad("the request body must be a JSON object")
    return body


def objects_of(
    value: Any, key: str, *, param: str | None = None, required: bool = False
) -> list[tuple[int, dict[str, Any]]]:
    """(index, item) of the request's array `key` of objects: none when it is absent and
    not required; a 400 (naming `param`) when it is not an array, is empty and required,
    or holds an item that is not an object."""
    if value is None and not required:
        return []
    if not isinstance(value, list):
        raise bad(f"'{key}' must be an array", param)
    if required and not value:
        raise bad(f"'{key}' must not be empty", param)
    for n, item in enumerate(value):
        if not isinstance(item, dict):
            raise bad(f"'{key}[{n}]' must be an object", param)
    return list(enumerate(value))


def field_of(
    obj: dict[str, Any],
    key: str,
    types: type | tuple[type, ...],
    default: Any = None,
    *,
    where: str = "",
    required: bool = False,
) -> Any:
    """obj[key] if it has one of `types` (null counts as absent), else a 400 naming it.
    JSON has one number type: `float` accepts integers too; `int` never accepts booleans."""
    value = obj.get(key)
    path = f"{where}.{key}" if where else key
    if value is None:
        if required:
            raise bad(f"'{path}' is required", path)
        return default
    wanted = types if isinstance(types, tuple) else (types,)
    accepted = (*wanted, int) if float in wanted else wanted
    if isinstance(value, bool) and bool not in wanted or not isinstance(value, accepted):
        names = " or ".join(_TYPE_NAMES.get(t, t.__name__) for t in wanted)
        raise bad(f"'{path}' must be {names}", path)
    return value


def number(
    obj: dict[str, Any],
    key: str,
    lo: float,
    hi: float,
    default: Any = None,
    *,
    integer: bool = False,
    where: str = "",
) -> Any:
    """A number in [lo, hi] (NaN and infinities are outside any range), or `default`."""
    value = field_of(obj, key, int if integer else float, None, where=where)
    if value is None:
        return default
    if not lo <= value <= hi:
        span = f"{lo} and {hi}" if integer else f"{lo:g} and {hi:g}"
        raise bad(f"'{key}' must be between {span}, got {value}", key)
    return value


def max_tokens_of(obj: dict[str, Any], *keys: str) -> int | None:
    for key in keys:
        value: int | None = field_of(obj, key, int, None)
        if value is not None:
            if value < 1:
                raise bad(f"'{key}' must be at least 1, got {value}", key)
            return value
    return None


SEED_MAX = (1 << 64) - 1  # seeds are taken as unsigned 64-bit integers


def sampling_of(
    obj: dict[str, Any], defaults: Sampling, *, max_temperature: float = 2.0
) -> Sampling:
    """The request's sampling fields, each checked against what the sampler accepts, so a
    bad value is a 400 naming it rather than a failure in the middle of generating."""
    top_p = number(obj, "top_p", 0.0, 1.0, defaults.top_p)
    if top_p <= 0:
        raise bad(f"'top_p' must be greater than 0 and at most 1, got {top_p}", "top_p")
    return Sampling(
        temperature=number(obj, "temperature", 0.0, max_temperature, defaults.temperature),
        top_p=top_p,
        top_k=number(obj, "top_k", 0, 1 << 31, defaults.top_k, integer=True),
        min_p=number(obj, "min_p", 0.0, 1.0, defaults.min_p),
        seed=number(obj, "seed", 0, SEED_MAX, None, integer=True),
        speculative=field_of(obj, "speculative", bool, defaults.speculative),
    )


STEERING_SCALE_MAX = 100.0  # |scale|, |attn|, |ffn|: far past where any model still talks
STEERING_LAYER_MAX = 1 << 16
_STEERING_KEYS = frozenset({"name", "scale", "attn", "ffn", "layers"})


def steering_of(value: Any, key: str = "steering") -> SteeringChoice | None:
    """The `steering` extension field (docs/steering.md): a vector's name as the config
    declares it ("off": unsteered), or {"name", "scale", "attn", "ffn", "layers": [A, B]}.
    Whether the name exists is the model's to say (a 400 too, when the prompt is
    prepared); everything else is checked here."""
    if value is None:
        return None
    if isinstance(value, str):
        value = {"name": value}
    if not isinstance(value, dict):
        raise bad(f"'{key}' must be a vector's name or an object", key)
    unknown = sorted(set(value) - _STEERING_KEYS)
    if unknown:
        raise bad(f"'{key}.{unknown[0]}' is not a steering field (name, scale, attn, ffn, "
                  "layers)", f"{key}.{unknown[0]}")  # fmt: skip
    name = field_of(value, "name", str, where=key, required=True)
    if not name:
        raise bad(f"'{key}.name' must not be empty", f"{key}.name")
    scales: dict[str, float | None] = {}
    for k in ("scale", "attn", "ffn"):
        v = field_of(value, k, float, None, where=key)
        if v is not None and not -STEERING_SCALE_MAX <= v <= STEERING_SCALE_MAX:
            raise bad(f"'{key}.{k}' must be between {-STEERING_SCALE_MAX:g} and "
                      f"{STEERING_SCALE_MAX:g}, got {v}", f"{key}.{k}")  # fmt: skip
        scales[k] = None if v is None else float(v)
    layers = value.get("layers")
    span: tuple[int, int] | None = None
    if layers is not None:
        ok = (isinstance(layers, list) and len(layers) == 2
              and all(isinstance(n, int) and not isinstance(n, bool) for n in layers))  # fmt: skip
        if not ok or not 0 <= layers[0] <= layers[1] <= STEERING_LAYER_MAX:
            raise bad(f"'{key}.layers' must be [first, last], 0 <= first <= last",
                      f"{key}.layers")  # fmt: skip
        span = (layers[0], layers[1])
    scale = scales["scale"]
    return SteeringChoice(name, 1.0 if scale is None else scale, scales["attn"], scales["ffn"],
                          span)  # fmt: skip


def stop_list(value: Any, key: str = "stop") -> list[str]:
    if value is None:
        return []
    if isinstance(value, str):
        return [value] if value else []
    if isinstance(value, list) and all(isinstance(s, str) for s in value):
        return [s for s in value if s]
    raise bad(f"'{key}' must be a string or an array of strings", key)


def json_text(value: Any, where: str) -> str:
    """Tool-call arguments: clients send a JSON string or an object; keep a JSON string."""
    if value is None:
        return "{}"
    if isinstance(value, str):
        return value
    if isinstance(value, dict):
        return json.dumps(value, ensure_ascii=False, separators=(",", ":"))
    raise bad(f"'{where}' must be a JSON string or an object", where)


def effort_thinking(effort: Any, key: str) -> bool | None:
    """reasoning_effort-style controls: "none" turns thinking off, the others on."""
    if effort is None:
        return None
    if not isinstance(effort, str):
        raise bad(f"'{key}' must be a string", key)
    if effort in ("none",):
        return False
    if effort in ("minimal", "low", "medium", "high", "xhigh", "max"):
        return True
    raise bad(f"'{key}' must be one of none, minimal, low, medium, high, xhigh, max", key)


def template_kwargs_of(value: Any, key: str = "chat_template_kwargs") -> dict[str, Any]:
    """The client's chat_template_kwargs (vLLM, SGLang and llama-server's field): an
    object; its `enable_thinking`, when present, must be a boolean."""
    kwargs: dict[str, Any] = field_of({key: value}, key, dict, {})
    field_of(kwargs, "enable_thinking", bool, None, where=key)
    return kwargs


def thinking_switch(
    kwargs: dict[str, Any], effort: Any = None, effort_key: str = "reasoning_effort"
) -> bool | None:
    """One thinking switch from the conventions a body may carry: the template kwarg
    `enable_thinking` (what Qwen's documentation gives for OpenAI-compatible servers)
    first, else a reasoning_effort-style value."""
    enabled = kwargs.get("enable_thinking")
    if isinstance(enabled, bool):
        effort_thinking(effort, effort_key)  # still checked: a bad value is a 400
        return enabled
    return effort_thinking(effort, effort_key)


def force_tool_choice(req: ChatRequest, setting: str) -> bool:
    """The `force_tool_choice` testing aid: "required" or a tool's name turns an `auto`
    tool choice into that forced one, once per conversation: only while it holds no
    tool call yet. The request carrying the call's result, and every later one, is left
    free, so the model can answer what the tool returned and the client's loop ends
    (agents answer a cut-off reply or a tool result with more user text, which must not
    force another call). Returns whether the request was changed."""
    if not setting or not req.tools or req.tool_choice.mode != "auto":
        return False
    if any(m.role == "tool" or m.tool_calls for m in req.messages):
        return False
    if setting == "required":
        req.tool_choice = ToolChoice("required")
        return True
    if setting in {t.name for t in req.tools}:
        req.tool_choice = ToolChoice("named", setting)
        return True
    return False


# ---- collecting a whole reply ----------------------------------------------------------


@dataclass
class Completion:
    """A finished generation, for non-streaming responses."""

    text: str = ""
    reasoning: str = ""
    tool_calls: list[ToolCall] = field(default_factory=list)
    usage: Usage = field(default_factory=lambda: Usage(0, 0))
    finish: Finish = field(default_factory=lambda: Finish("stop"))
    # When each Usage event and the Finish arrived (perf_counter): the generator sends the
    # prompt's usage when the job starts, again once the prompt is in the KV, and last
    # with the generated count; llama.cpp's timings are read off these.
    usage_at: list[float] = field(default_factory=list)
    finished_at: float | None = None

    def phase_seconds(self) -> tuple[float, float]:
        """(prompt, generation) seconds as seen from here: from the job's start to the
        prompt's KV being ready (slot wait included), then to the finish."""
        if len(self.usage_at) < 2:
            return 0.0, 0.0
        end = self.finished_at if self.finished_at is not None else self.usage_at[-1]
        return self.usage_at[1] - self.usage_at[0], end - self.usage_at[1]

    def add(self, ev: Event) -> None:
        if isinstance(ev, Usage):
            self.usage_at.append(time.perf_counter())
        elif isinstance(ev, Finish):
            self.finished_at = time.perf_counter()
        if isinstance(ev, TextDelta):
            self.text += ev.text
        elif isinstance(ev, ReasoningDelta):
            self.reasoning += ev.text
        elif isinstance(ev, ToolCallStart):
            self.tool_calls.append(ToolCall(ev.id, ev.name, ""))
        elif isinstance(ev, ToolCallEnd):
            self.tool_calls[ev.index].arguments = ev.arguments
        elif isinstance(ev, Usage):
            self.usage = ev
        elif isinstance(ev, Finish):
            self.finish = ev


# ---- SSE -----------------------------------------------------------------------------


def sse(data: Any, event: str | None = None) -> str:
    body = data if isinstance(data, str) else json.dumps(data, ensure_ascii=False)
    head = f"event: {event}\n" if event else ""
    return f"{head}data: {body}\n\n"


KEEPALIVE = ": keepalive\n\n"


def content_text(value: Any, where: str, text_types: tuple[str, ...]) -> str:
    """A message's content: a string, null, or an array of parts whose text parts are
    joined; other parts (images, files, ...) are dropped, since the model reads text."""
    if value is None:
        return ""
    if isinstance(value, str):
        return value
    if not isinstance(value, list):
        raise bad(f"'{where}' must be a string or an array of content parts", where)
    out = []
    for n, part in enumerate(value):
        if isinstance(part, str):
            out.append(part)
        elif isinstance(part, dict):
            kind = part.get("type", "text")
            if kind in text_types:
                text = part.get("text")
                if text is not None and not isinstance(text, str):
                    raise bad(f"'{where}[{n}].text' must be a string", where)
                out.append(text or "")
        else:
            raise bad(f"'{where}[{n}]' must be an object", where)
    return "".join(out)
