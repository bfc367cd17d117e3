"""Per-family chat formats behind one interface, for the serving loop:

    fmt = chat_format_for(engine, n_ctx)
    text = fmt.render(request)                 # the prompt text
    special = fmt.tokenize_special(request)    # parse special-token text in it?
    fmt.forced_call(vocab, request)            # tool_choice required / named
    fmt.structured_start(request)              # where a JSON answer (a format) begins
    decode = fmt.decode(request)               # per generation:
        params = decode.sampling(params)       #   before each sampled token
        events = decode.feed(text)             #   its decoded text
        decode.stopped / decode.tool_block_closed  -> end the generation
        if decode.call_opened:                 #   the model opened a call on its own:
            step = decode.constrain_call(vocab)  #   constrain the rest (None: cannot)
        decode.in_reasoning                    #   inside the thinking block
        events = decode.flush()                #   at the end
        decode.replay, decode.malformed        #   tool memory records; a dropped call

Template-driven models (llama family: SmolLM2, Qwen, Llama, Mistral, gpt-oss, ...) use
`TemplateChatFormat`: the GGUF's jinja template, and the tool-call syntax its source
shows (`call_syntax_for`); DeepSeek V4 uses `ds4d.chat.deepseek4_output.DS4ChatFormat`
(its own encoding, DSML tool calls).
"""

from __future__ import annotations

import dataclasses
import json
from typing import TYPE_CHECKING, Protocol, TypeVar

from ds4d.chat.constrain import Step, VocabIndex
from ds4d.chat.editlimits import EditLimits
from ds4d.chat.render import Template, render_request, template_supports_tools
from ds4d.chat.stream import OutputParser
from ds4d.chat.toolsyntax import CallParser, Syntax, prefixed, read_replay_record
from ds4d.chat.toolsyntax_harmony import CHANNEL, MESSAGE, HarmonyParser, HarmonySyntax
from ds4d.chat.toolsyntax_hermes import HermesSyntax
from ds4d.chat.toolsyntax_llama import LlamaSyntax
from ds4d.chat.toolsyntax_mistral import MistralSyntax
from ds4d.chat.toolsyntax_qwen_xml import QwenXMLSyntax
from ds4d.chat.types import ChatRequest, Event, Message, Tool

if TYPE_CHECKING:
    from ds4d.engine.engine import Engine
    from ds4d.engine.tokenizer_api import ModelTokenizer

P = TypeVar("P")


class ChatFormat(Protocol):
    """A family's chat format as the serving loop uses it (see the module docstring):
    TemplateChatFormat, or DeepSeek V4's DS4ChatFormat."""

    family: str

    def render(self, request: ChatRequest) -> str:
        """The prompt text."""
        ...

    def tokenize_special(self, request: ChatRequest) -> bool:
        """Whether special-token text in the prompt is parsed as those tokens."""
        ...

    def decode(self, request: ChatRequest) -> TemplateDecode:
        """The output pipeline of one generation."""
        ...

    def forced_call(self, vocab: VocabIndex, request: ChatRequest) -> Step:
        """The constraint writing the call a required / named tool_choice forces."""
        ...

    def structured_start(self, request: ChatRequest) -> StructuredStart:
        """Where the JSON of a structured answer (`request.output_format`) begins."""
        ...


@dataclasses.dataclass(frozen=True)
class StructuredStart:
    """Where a structured (JSON) answer begins. `prefix`: text forced before the JSON
    (a channel header), or None when the prompt opened the thinking block: the model
    thinks unconstrained and the JSON starts once it closes the block. `markup`:
    characters no JSON string may hold (they could spell the syntax's markup)."""

    prefix: str | None = ""
    markup: str = ""


# A plain ChatML template for GGUFs that carry none.
FALLBACK_TEMPLATE = (
    "{% for m in messages %}{{ '<|im_start|>' + m['role'] + '\n' + m['content'] + "
    "'<|im_end|>\n' }}{% endfor %}{% if add_generation_prompt %}"
    "{{ '<|im_start|>assistant\n' }}{% endif %}"
)


def call_syntax_for(source: str) -> Syntax:
    """The tool-call syntax a chat template teaches its model, told by the markup its
    source writes; a template that does not render tools gets ds4d's Hermes block (see
    `render.py`), so its model is read as Hermes."""
    if not template_supports_tools(source):
        return HermesSyntax()
    if "<|channel|>" in source:
        return HarmonySyntax()
    if "<function=" in source:
        return QwenXMLSyntax()
    if "[TOOL_CALLS]" in source:
        return MistralSyntax(named="[ARGS]" in source)
    if "<tool_call>" in source:
        return HermesSyntax()
    if "<|python_tag|>" in source or '"parameters"' in source:
        return LlamaSyntax()
    return HermesSyntax()


class TemplateDecode:
    """The shared output pipeline; sampling is the client's, every token."""

    def __init__(
        self, parser: OutputParser, syntax: Syntax | None = None, tools: list[Tool] | None = None
    ) -> None:
        self.parser = parser
        self.syntax = syntax
        self.tools = tools or []
        self._constrained = 0  # call blocks handed a constraint (or found unconstrainable)

    def _calls(self) -> CallParser | HarmonyParser | None:
        """The call parser of a template syntax, when tools are active."""
        tools = self.parser.tools
        return tools if isinstance(tools, CallParser | HarmonyParser) else None

    @property
    def stopped(self) -> bool:
        """A stop sequence, or the end of the reply written out (harmony's `<|return|>`, or
        a tool-result marker the model began writing itself)."""
        tools = self._calls()
        return self.parser.stopped or (tools is not None and tools.returned)

    @property
    def stop_sequence(self) -> str | None:
        return self.parser.stop_sequence

    @property
    def cut_marker(self) -> str | None:
        """The text that ended the reply inside the generated text and was not delivered
        (a stop sequence, or a tool-result marker the model began writing), if one did."""
        tools = self._calls()
        if isinstance(tools, CallParser) and tools.returned:
            return tools.ender
        return self.parser.stop_sequence

    @property
    def tool_calls(self) -> int:
        return self.parser.tool_calls

    @property
    def tool_block_closed(self) -> bool:
        """Harmony's `<|call|>` ends the turn; Hermes-style models may call several
        tools in a row, and their end of sequence ends it."""
        tools = self.parser.tools
        return isinstance(tools, HarmonyParser) and tools.ended

    @property
    def replay(self) -> dict[str, str]:
        """Call id -> the record the tool memory keeps for it (`toolsyntax.replay_record`:
        the arguments and the text the model sampled; for a streamed syntax such as
        DeepSeek V4's DSML, the exact block the call was sampled in)."""
        calls = self._calls()
        return dict(calls.replay) if calls is not None else {}

    @property
    def malformed(self) -> str | None:
        """Why a call block was not read as calls (one line), if one was: dropped, or
        returned as text where the syntax says so (DSML)."""
        calls = self._calls()
        return calls.malformed if calls is not None else None

    @property
    def call_opened(self) -> bool:
        """The model has just opened a call block that is not constrained yet."""
        calls = self._calls()
        return self.syntax is not None and calls is not None and calls.opened > self._constrained

    def constrain_call(self, vocab: VocabIndex) -> Step | None:
        """The constraint that finishes the call block the model opened (a valid call of
        a declared tool), or None when what it wrote already cannot be continued."""
        calls = self._calls()
        if calls is None:
            return None
        self._constrained = calls.opened
        if self.syntax is None or not self.tools:
            return None
        return self.syntax.constrain_open(vocab, self.tools, calls.block_text + self.parser.held)

    @property
    def in_reasoning(self) -> bool:
        """Inside the thinking block (a structured answer starts after it)."""
        think = self.parser.think
        return think is not None and think.in_reasoning

    def sampling(self, params: P) -> P:
        return params

    def feed(self, text: str) -> list[Event]:
        return self.parser.feed(text)

    def flush(self) -> list[Event]:
        return self.parser.flush()


class TemplateChatFormat:
    family = "template"

    def __init__(self, template: Template, syntax: Syntax | None = None) -> None:
        self.template = template
        self.syntax = syntax or call_syntax_for(template.source)
        self._opens_reasoning: dict[bool | None, bool] = {}

    def render(self, request: ChatRequest) -> str:
        """The prompt; past calls the tool memory knows are written back as sampled."""
        if request.raw_prompt is not None:
            return render_request(self.template, request)
        request, sampled = self._with_replayed_calls(request)
        return put_back_sampled(render_request(self.template, request), sampled)

    def _with_replayed_calls(
        self, request: ChatRequest
    ) -> tuple[ChatRequest, list[tuple[str, str]]]:
        """The request with replay records swapped for their arguments, and per replayed
        call (template's spelling, sampled spelling), in prompt order."""
        pairs: list[tuple[str, str]] = []
        messages = []
        for m in request.messages:
            calls = []
            for c in m.tool_calls:
                record = read_replay_record(c.arguments)
                if record is not None:
                    args, sampled = record
                    # A template that prints arguments as given gets the sampled JSON
                    # itself; one that re-serializes them is patched after rendering.
                    c = dataclasses.replace(c, arguments=_same_json(sampled, args) or args)
                    written = self.syntax.template_text(c.name, json.loads(args))
                    if written != sampled:
                        pairs.append((written, sampled))
                calls.append(c)
            messages.append(dataclasses.replace(m, tool_calls=calls) if m.tool_calls else m)
        return dataclasses.replace(request, messages=messages), pairs

    def tokenize_special(self, request: ChatRequest) -> bool:
        # A legacy completion prompt is the user's own text: "<|im_start|>" in it is text.
        return request.raw_prompt is None

    def decode(self, request: ChatRequest) -> TemplateDecode:
        chat = request.raw_prompt is None
        harmony = chat and isinstance(self.syntax, HarmonySyntax)
        parser = OutputParser(
            tools=False,
            stops=request.stop,
            in_reasoning=not harmony and self.opens_reasoning(request.thinking),
            id_prefix=request.tool_id_prefix,
            split_thinking=chat and not harmony,
            limits=EditLimits(request.n_indent, request.t_max_predict_ms),
        )
        active = chat and request.tools_active
        if harmony:  # channels carry the thinking split and the calls alike
            parser.tools = HarmonyParser(request.tools, request.tool_id_prefix, active)
        elif active:
            parser.tools = CallParser(self.syntax, request.tools, request.tool_id_prefix)
        return TemplateDecode(parser, self.syntax if active else None, request.tools)

    def forced_call(self, vocab: VocabIndex, request: ChatRequest) -> Step:
        """The constraint that writes a forced (required / named) call in the model's
        syntax (closing the reasoning first when the prompt opened it)."""
        step = self.syntax.forced(vocab, request.tools, request.tool_choice)
        if not isinstance(self.syntax, HarmonySyntax) and self.opens_reasoning(request.thinking):
            return prefixed("</think>\n\n", step)
        return step

    def structured_start(self, request: ChatRequest) -> StructuredStart:
        """A JSON answer: in harmony's final channel (no analysis first: the channel
        header is forced); after the thinking block the prompt opened, if it did; else
        from the first token (a model that would open its thinking block itself answers
        without one). With tools in play `<` stays out of strings: no call markup."""
        harmony = request.raw_prompt is None and isinstance(self.syntax, HarmonySyntax)
        markup = "<" if harmony or request.tools_active else ""
        if harmony:
            return StructuredStart(f"{CHANNEL}final{MESSAGE}", markup)
        if request.raw_prompt is None and self.opens_reasoning(request.thinking):
            return StructuredStart(None, markup)
        return StructuredStart("", markup)

    def opens_reasoning(self, thinking: bool | None) -> bool:
        """Does the generation prompt end inside `<think>` (R1-distill style templates)?
        Found once per thinking setting by rendering a one-message conversation."""
        if thinking not in self._opens_reasoning:
            probe = render_request(
                self.template, ChatRequest([Message("user", "x")], thinking=thinking)
            )
            self._opens_reasoning[thinking] = probe.rstrip().endswith("<think>")
        return self._opens_reasoning[thinking]


def chat_format_for(engine: Engine, n_ctx: int) -> ChatFormat:
    """The chat format of the loaded model's family."""
    if engine.info.family == "deepseek4":
        from ds4d.chat.deepseek4_output import DS4ChatFormat

        return DS4ChatFormat(n_ctx)
    from ds4d.chat.template import ChatTemplate

    tok = engine.tokenizer
    return TemplateChatFormat(
        ChatTemplate(
            engine.chat_template or FALLBACK_TEMPLATE,
            _token_text(tok, tok.bos_id),
            _token_text(tok, tok.eos_id),
        )
    )


def put_back_sampled(prompt: str, pairs: list[tuple[str, str]]) -> str:
    """`prompt` with each template-written call span replaced by the text the model
    sampled for it, searched in order (a span the template did not write stays)."""
    at = 0
    for written, sampled in pairs:
        i = prompt.find(written, at)
        if i < 0:
            continue
        prompt = prompt[:i] + sampled + prompt[i + len(written) :]
        at = i + len(sampled)
    return prompt


def _same_json(text: str, compact_json: str) -> str | None:
    """`text` when it is the JSON of the same value as `compact_json`."""
    try:
        return text if json.loads(text) == json.loads(compact_json) else None
    except ValueError:
        return None


def _token_text(tok: ModelTokenizer, token: int | None) -> str:
    return tok.decode([token]) if token is not None else ""
