"""Per-family chat formats behind one interface, for the serving loop:

    fmt = chat_format_for(engine, n_ctx)
    text = fmt.render(request)                 # the prompt text
    special = fmt.tokenize_special(request)    # parse special-token text in it?
    fmt.forced_call(vocab, request)            # tool_choice required / named
    decode = fmt.decode(request)               # per generation:
        params = decode.sampling(params)       #   before each sampled token
        events = decode.feed(text)             #   its decoded text
        decode.stopped / decode.tool_block_closed  -> end the generation
        events = decode.flush()                #   at the end

Template-driven models (llama family: SmolLM2, Qwen, ...) use `TemplateChatFormat`
(the GGUF's jinja template, Hermes tool calls); DeepSeek V4 uses
`ds4d.chat.deepseek4_output.DS4ChatFormat` (its own encoding, DSML tool calls).
"""

from __future__ import annotations

from typing import Any, TypeVar

from ds4d.chat.constrain import Step, VocabIndex, forced_tool_call
from ds4d.chat.render import Template, render_request
from ds4d.chat.stream import OutputParser
from ds4d.chat.types import ChatRequest, Event, Message

P = TypeVar("P")

# A plain ChatML template for GGUFs that carry none.
FALLBACK_TEMPLATE = (
    "{% for m in messages %}{{ '<|im_start|>' + m['role'] + '\n' + m['content'] + "
    "'<|im_end|>\n' }}{% endfor %}{% if add_generation_prompt %}"
    "{{ '<|im_start|>assistant\n' }}{% endif %}"
)


class TemplateDecode:
    """The shared output pipeline; sampling is the client's, every token."""

    def __init__(self, parser: OutputParser) -> None:
        self.parser = parser

    @property
    def stopped(self) -> bool:
        return self.parser.stopped

    @property
    def stop_sequence(self) -> str | None:
        return self.parser.stop_sequence

    @property
    def tool_calls(self) -> int:
        return self.parser.tool_calls

    @property
    def tool_block_closed(self) -> bool:
        return False  # Hermes models may call several tools in a row; EOS ends the turn

    @property
    def replay(self) -> dict[str, str]:
        """Call id -> the text the tool memory keeps for it, where that is more than the
        call's arguments (which are remembered as each call ends)."""
        return {}

    def sampling(self, params: P) -> P:
        return params

    def feed(self, text: str) -> list[Event]:
        return self.parser.feed(text)

    def flush(self) -> list[Event]:
        return self.parser.flush()


class TemplateChatFormat:
    family = "template"

    def __init__(self, template: Template) -> None:
        self.template = template
        self._opens_reasoning: dict[bool | None, bool] = {}

    def render(self, request: ChatRequest) -> str:
        return render_request(self.template, request)

    def tokenize_special(self, request: ChatRequest) -> bool:
        # A legacy completion prompt is the user's own text: "<|im_start|>" in it is text.
        return request.raw_prompt is None

    def decode(self, request: ChatRequest) -> TemplateDecode:
        return TemplateDecode(OutputParser(
            tools=request.tools_active,
            stops=request.stop,
            in_reasoning=self.opens_reasoning(request.thinking),
            id_prefix=request.tool_id_prefix,
            split_thinking=request.raw_prompt is None,
        ))

    def forced_call(self, vocab: VocabIndex, request: ChatRequest) -> Step:
        """The constraint that writes a forced (required / named) call in Hermes syntax."""
        return forced_tool_call(vocab, request.tools, request.tool_choice)

    def opens_reasoning(self, thinking: bool | None) -> bool:
        """Does the generation prompt end inside `<think>` (R1-distill style templates)?
        Found once per thinking setting by rendering a one-message conversation."""
        if thinking not in self._opens_reasoning:
            probe = render_request(self.template, ChatRequest([Message("user", "x")],
                                                              thinking=thinking))
            self._opens_reasoning[thinking] = probe.rstrip().endswith("<think>")
        return self._opens_reasoning[thinking]


def chat_format_for(engine: Any, n_ctx: int) -> Any:
    """The chat format of the loaded model's family."""
    if engine.info.family == "deepseek4":
        from ds4d.chat.deepseek4_output import DS4ChatFormat

        return DS4ChatFormat(n_ctx)
    from ds4d.chat.template import ChatTemplate

    tok = engine.tokenizer
    return TemplateChatFormat(ChatTemplate(engine.chat_template or FALLBACK_TEMPLATE,
                                           _token_text(tok, tok.bos_id),
                                           _token_text(tok, tok.eos_id)))


def _token_text(tok: Any, token: int | None) -> str:
    return tok.decode([token]) if token is not None else ""
