"""DeepSeek V4 generated text -> neutral events: the thinking split and the DSML tool
parser plugged into the shared output pipeline (stop sequences -> thinking -> tools)."""

from __future__ import annotations

import dataclasses
from typing import TypeVar

from ds4d.chat.constrain import Step, VocabIndex
from ds4d.chat.deepseek4 import (
    Replay,
    ThinkMode,
    render_completion,
    render_request,
    think_mode,
    uses_tool_context,
)
from ds4d.chat.deepseek4_dsml import DSMLToolParser, DSMLTracker
from ds4d.chat.deepseek4_forced import DSMLVocab, forced_dsml_call
from ds4d.chat.formats import StructuredStart, TemplateDecode
from ds4d.chat.stream import OutputParser, partial_suffix_len
from ds4d.chat.types import ChatRequest, Event
from ds4d.engine.ds4_tokenizer import THINK_CLOSE, THINK_OPEN


class ThinkSplitter:
    """Splits V4 output into reasoning and answer text.

    In thinking mode the prompt already ends with `<think>`, so generation starts in
    reasoning and the first `</think>` ends it. A leading literal `<think>` is skipped.
    The answer after `</think>` is passed on byte for byte (nothing stripped): the client
    sends it back in the next request, which must render exactly the tokens in the KV.
    Same interface as `ds4d.chat.stream.ThinkSplitter`.
    """

    def __init__(self, in_reasoning: bool = False) -> None:
        self.in_reasoning = in_reasoning
        self.closed = False  # `</think>` was seen
        self._at_start = True
        self.buf = ""

    def feed(self, piece: str) -> list[tuple[str, str]]:
        """(channel, text) pairs; channel is "reasoning" or "text"."""
        self.buf += piece
        out: list[tuple[str, str]] = []
        if self._at_start:
            if THINK_OPEN.startswith(self.buf):
                return out  # may still be a leading <think>
            self._at_start = False
            if self.buf.startswith(THINK_OPEN):
                self.buf = self.buf[len(THINK_OPEN) :]
                self.in_reasoning = True
        if self.in_reasoning:
            i = self.buf.find(THINK_CLOSE)
            if i < 0:
                keep = partial_suffix_len(self.buf, THINK_CLOSE)
                out.append(("reasoning", self.buf[: len(self.buf) - keep]))
                self.buf = self.buf[len(self.buf) - keep :]
                return [p for p in out if p[1]]
            out.append(("reasoning", self.buf[:i]))
            self.buf = self.buf[i + len(THINK_CLOSE) :]
            self.in_reasoning = False
            self.closed = True
        out.append(("text", self.buf))
        self.buf = ""
        return [p for p in out if p[1]]

    def flush(self) -> list[tuple[str, str]]:
        text, self.buf = self.buf, ""
        self._at_start = False
        if not text:
            return []
        return [("reasoning" if self.in_reasoning else "text", text)]


def output_parser(
    *, tools: bool, stops: list[str] | None, thinking: bool, id_prefix: str = "call_"
) -> OutputParser:
    """The shared pipeline with V4's thinking split and DSML tool parser."""
    parser = OutputParser(tools=tools, stops=stops, in_reasoning=thinking, id_prefix=id_prefix)
    parser.think = ThinkSplitter(thinking)
    if tools:
        parser.tools = DSMLToolParser(id_prefix)
    return parser


P = TypeVar("P")

# The DeepSeek API's model names and their thinking defaults (any other name: thinking).
MODEL_THINKING = {"deepseek-chat": False, "deepseek-reasoner": True}

# Thinking modes sample with these, whatever the client asked for (as ds4 does).
THINKING_SAMPLING = {"temperature": 1.0, "top_k": 0, "top_p": 1.0, "min_p": 0.05}


class DS4Decode(TemplateDecode):
    """The DeepSeek V4 side of one generation, for the shared decode loop:

        decode = DS4Decode(request, mode)
        per token:  params = decode.sampling(base_params)   # before sampling it
                    events = decode.feed(text)             # its decoded text
                    if decode.tool_block_closed: finish "tool_calls"
        at the end: events = decode.flush()

    Sampling follows ds4: thinking modes ignore the client's knobs, and with tools active
    the markup of a DSML block (not its parameter payloads) is sampled greedily.
    """

    def __init__(self, request: ChatRequest, mode: ThinkMode) -> None:
        self.mode = mode
        if request.raw_prompt is not None:
            # Legacy completions return the raw text, reasoning and all; only stop
            # sequences apply.
            self.tools_active = False
            parser = OutputParser(tools=False, stops=request.stop, split_thinking=False)
        else:
            self.tools_active = request.tools_active
            # Calls are parsed whenever tools are in play, even with tool_choice "none"
            # (ds4 does too); stopping at the block end and greedy markup need them active.
            parser = output_parser(
                tools=uses_tool_context(request),
                stops=request.stop,
                thinking=mode.thinking,
                id_prefix=request.tool_id_prefix,
            )
        super().__init__(parser)
        self.tracker = DSMLTracker() if self.tools_active else None

    @property
    def greedy(self) -> bool:
        return self.tracker is not None and self.tracker.greedy

    @property
    def tool_block_closed(self) -> bool:
        """The end tag of a tool block was generated: stop here (no EOS follows)."""
        tools = self.parser.tools
        return self.tools_active and isinstance(tools, DSMLToolParser) and tools.ended

    def sampling(self, params: P) -> P:
        """`params` (a dataclass with temperature/top_k/top_p/min_p) for the next token."""
        if self.greedy:
            return dataclasses.replace(params, temperature=0.0)  # type: ignore[type-var]
        if self.mode.thinking:
            return dataclasses.replace(params, **THINKING_SAMPLING)  # type: ignore[type-var]
        return params

    def feed(self, text: str) -> list[Event]:
        if self.tracker is not None:
            self.tracker.feed(text)
        return self.parser.feed(text)


class DS4ChatFormat:
    """Everything model-specific about chatting with a DeepSeek V4 model, behind the
    calls the serving loop makes for any family:

        text = fmt.render(request)              # tokenize with special=True, always
        decode = fmt.decode(request)            # see DS4Decode
        step = fmt.forced_call(vocab, request)  # tool_choice required / named

    `replay` maps tool-call ids to the raw DSML the model generated for them (the state
    layer's tool memory), so history renders exactly as it was sampled.
    """

    family = "deepseek4"

    def __init__(self, n_ctx: int, replay: Replay | None = None) -> None:
        self.n_ctx = n_ctx
        self.replay = replay
        self._dsml_vocab: tuple[VocabIndex, DSMLVocab] | None = None

    def mode(self, request: ChatRequest) -> ThinkMode:
        """The request's thinking mode; a client that says nothing about thinking gets
        the DeepSeek API's model aliases (deepseek-chat answers directly)."""
        thinking = request.thinking
        if thinking is None:
            thinking = MODEL_THINKING.get(request.model)
        return think_mode(thinking, request.reasoning_effort, self.n_ctx)

    def render(self, request: ChatRequest) -> str:
        """The prompt text; legacy completions get ds4's fixed wrapper around the prompt,
        so the text always holds chat markers to be split out."""
        mode = self.mode(request)
        if request.raw_prompt is not None:
            return render_completion(request.raw_prompt, mode)
        return render_request(request, mode, self.replay)

    def tokenize_special(self, request: ChatRequest) -> bool:
        """Always: even a legacy completion's prompt is wrapped in chat markers."""
        return True

    def decode(self, request: ChatRequest) -> DS4Decode:
        return DS4Decode(request, self.mode(request))

    def structured_start(self, request: ChatRequest) -> StructuredStart:
        """A JSON answer starts after the thinking block of a thinking mode (its prompt
        opens it), else at the first token; with tools in play `<` stays out of strings
        (DSML markup)."""
        thinking = request.raw_prompt is None and self.mode(request).thinking
        return StructuredStart(None if thinking else "", "<" if request.tools_active else "")

    def forced_call(self, vocab: VocabIndex, request: ChatRequest) -> Step:
        """The constraint that writes a forced (required / named) call as a DSML block."""
        if self._dsml_vocab is None or self._dsml_vocab[0] is not vocab:
            self._dsml_vocab = (vocab, DSMLVocab(vocab))
        return forced_dsml_call(
            self._dsml_vocab[1],
            request.tools,
            request.tool_choice,
            close_thinking=self.mode(request).thinking,
        )
