"""Protocol-neutral chat request and generation events.

Every HTTP API translates its request JSON into a `ChatRequest` and renders the stream of
`Event`s back into its own wire format; nothing below the API layer knows which protocol
a request came from.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Literal

if TYPE_CHECKING:
    from ds4d.chat.fim import FimPrompt, InfillInput


@dataclass
class ToolCall:
    id: str
    name: str
    arguments: str  # JSON text of an object, as the client or the model wrote it


Role = Literal["system", "user", "assistant", "tool"]


@dataclass
class Message:
    role: Role
    content: str = ""
    reasoning: str | None = None
    tool_calls: list[ToolCall] = field(default_factory=list)
    tool_call_id: str | None = None  # role "tool": the call this is the result of
    name: str | None = None  # role "tool": the tool's name when the client sent it


@dataclass
class Tool:
    name: str
    description: str = ""
    parameters: dict[str, Any] = field(default_factory=lambda: {"type": "object", "properties": {}})


@dataclass
class ToolChoice:
    mode: Literal["auto", "none", "required", "named"] = "auto"
    name: str | None = None  # mode "named"

    @property
    def forced(self) -> bool:
        return self.mode in ("required", "named")


@dataclass
class Sampling:
    temperature: float = 0.7
    top_p: float = 1.0
    top_k: int = 0
    min_p: float = 0.05
    seed: int | None = None
    infill: bool = False  # llama.cpp's infill rule (ds4d.engine.sampler: code completion)
    # Speculative decoding may draft for this request (the daemon's `speculative` mode
    # decides whether it does): it changes no token, only how many passes they take.
    speculative: bool = True


@dataclass(frozen=True)
class OutputFormat:
    """Structured output: the answer is JSON (Ollama's `format`, OpenAI's
    `response_format`, the Responses API's `text.format`), any object when `schema` is
    None, else a value of that JSON schema (checked by ds4d.chat.structured.unsupported)."""

    schema: dict[str, Any] | None = None


# A request's `steering` naming this runs it unsteered, whatever the model's steering is.
STEERING_OFF = "off"


@dataclass(frozen=True)
class SteeringChoice:
    """A request's own steering (the `steering` extension field, docs/steering.md): a
    control vector the daemon's config names (`steering_vectors`), times `scale`, with
    these attention / FFN scales and layer range where given (else ffn 1, attn 0, every
    layer, as llama.cpp applies a control vector); the name STEERING_OFF: none at all."""

    name: str
    scale: float = 1.0
    attn: float | None = None
    ffn: float | None = None
    layers: tuple[int, int] | None = None  # first and last layer, inclusive


# How urgently a request wants the engine. The engine loop serves a waiting "completion"
# (an editor's inline completion: someone is watching the cursor) before "chat" (agents,
# chat clients), and both before "background" (warm-ups, restores nobody waits on).
Priority = Literal["completion", "chat", "background"]


@dataclass
class ChatRequest:
    messages: list[Message]
    tools: list[Tool] = field(default_factory=list)
    tool_choice: ToolChoice = field(default_factory=ToolChoice)
    sampling: Sampling = field(default_factory=Sampling)
    max_tokens: int | None = None  # None: up to the context
    stop: list[str] = field(default_factory=list)
    thinking: bool | None = None  # None: the model's default
    reasoning_effort: str | None = None  # as the client said it: none ... high, max
    # The client's chat_template_kwargs: passed to a template that reads them (the
    # thinking switch among them is already folded into `thinking`).
    template_kwargs: dict[str, Any] = field(default_factory=dict)
    model: str = ""
    stream: bool = False
    include_usage: bool = False  # streaming: send usage at the end (OpenAI asks for it)
    raw_prompt: str | None = None  # legacy completions: the text is the prompt, no template
    # The prompt as token ids, already assembled (fill-in-the-middle: special tokens around
    # user text that must never be parsed as markup). Takes precedence over raw_prompt.
    prompt_ids: list[int] | None = None
    priority: Priority = "chat"
    # Requests that share a key replace each other: a newer one cancels the older one still
    # running (an editor's completion for a cursor that has since moved on).
    supersede_key: str | None = None
    tool_id_prefix: str = "call_"  # "toolu_" for Anthropic clients
    # Anthropic's cache_control: the conversation up to the last mark, and once the prompt
    # is prepared the length of its part of the prompt in tokens (the usage split).
    cache_prefix: ChatRequest | None = None
    cache_prefix_tokens: int = 0
    # Fill-in-the-middle (an editor's cursor context): the daemon assembles it into
    # prompt_ids (ds4d.chat.fim.assemble_request) and keeps what assembly gave in
    # fim_prompt (what was cut to fit).
    fim: InfillInput | None = None
    fim_prompt: FimPrompt | None = None
    # Code completion's stopping rules (llama.cpp's /infill): every line after the first
    # must be indented by at least n_indent, and past t_max_predict_ms of generating the
    # next newline ends the text. 0: off.
    n_indent: int = 0
    t_max_predict_ms: int = 0
    response_fields: list[str] = field(default_factory=list)  # llama.cpp's: only these paths
    # The answer constrained to JSON (ds4d.chat.structured), after any thinking.
    output_format: OutputFormat | None = None
    # Several candidate completions of the one prompt (llama.cpp's n_cmpl), generated one
    # after another: the prompt is evaluated once, the later ones start from its KV.
    candidates: int = 1
    # Its own steering (None: the model's current one, docs/steering.md).
    steering: SteeringChoice | None = None

    @property
    def tools_active(self) -> bool:
        return bool(self.tools) and self.tool_choice.mode != "none"


# ---- events, in the order a generation produces them ---------------------------------


@dataclass
class ReasoningDelta:
    text: str


@dataclass
class TextDelta:
    text: str


@dataclass
class ToolCallStart:
    index: int
    id: str
    name: str


@dataclass
class ToolCallArgsDelta:
    index: int
    text: str


@dataclass
class ToolCallEnd:
    index: int
    arguments: str  # the complete, valid JSON object text


@dataclass
class Usage:
    prompt_tokens: int
    completion_tokens: int
    cached_tokens: int = 0
    cache_source: str = "none"

    @property
    def uncached_tokens(self) -> int:
        return self.prompt_tokens - self.cached_tokens


FinishReason = Literal["stop", "length", "tool_calls", "error"]


@dataclass
class Finish:
    reason: FinishReason
    error: str | None = None
    stop_sequence: str | None = None  # the client stop sequence that ended the text


Event = (
    ReasoningDelta | TextDelta | ToolCallStart | ToolCallArgsDelta | ToolCallEnd | Usage | Finish
)
