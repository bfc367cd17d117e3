"""A chat conversation run in-process on one engine session (`ds4d eval`, `ds4d chat
--local`): the request rendered by the family's chat format exactly as the daemon renders
it, the session's held prefix reused (only what is new is prefilled), sampled token by
token through the format's output pipeline, events handed to a callback as they come.
No tool-call constraint is applied: what comes out is what the model wrote."""

from __future__ import annotations

import threading
from collections.abc import Callable
from dataclasses import dataclass, field

from ds4d.chat.formats import ChatFormat, TemplateChatFormat, chat_format_for
from ds4d.chat.template import ChatTemplate
from ds4d.chat.types import (
    ChatRequest,
    Event,
    ReasoningDelta,
    TextDelta,
    ToolCallEnd,
    ToolCallStart,
)
from ds4d.engine.engine import Engine
from ds4d.engine.sampler import SamplingParams, make_rng, sample


@dataclass
class Reply:
    text: str = ""
    reasoning: str = ""
    tool_calls: list[tuple[str, str]] = field(default_factory=list)  # (name, arguments JSON)
    finish: str = "stop"  # stop | length | interrupted
    prompt_tokens: int = 0
    cached_tokens: int = 0  # prompt tokens the session already held
    completion_tokens: int = 0


def template_format(engine: Engine, source: str) -> ChatFormat:
    """The chat format of a jinja template given by the user (`--chat-template FILE`), for
    a GGUF that carries none or a wrong one."""
    tok = engine.tokenizer
    bos = tok.token_text(tok.bos_id) if tok.bos_id is not None else ""
    eos = tok.token_text(tok.eos_id) if tok.eos_id is not None else ""
    return TemplateChatFormat(ChatTemplate(source, bos, eos))


class LocalChat:
    """One session of `engine` and the family's chat format, for turn after turn."""

    def __init__(self, engine: Engine, n_ctx: int, chat_format: ChatFormat | None = None) -> None:
        self.engine = engine
        self.n_ctx = n_ctx
        self.format = chat_format or chat_format_for(engine, n_ctx)
        self.session = engine.new_session(n_ctx)

    def prompt_ids(self, request: ChatRequest) -> list[int]:
        tok = self.engine.tokenizer
        ids = tok.encode(self.format.render(request), special=self.format.tokenize_special(request))
        if tok.add_bos and tok.bos_id is not None and (not ids or ids[0] != tok.bos_id):
            ids.insert(0, tok.bos_id)
        return ids

    def generate(self, request: ChatRequest, on_event: Callable[[Event], None] | None = None,
                 interrupt: threading.Event | None = None) -> Reply:  # fmt: skip
        """The reply to request (its sampling and max_tokens; greedy at temperature 0).
        ValueError when the prompt does not fit the context. `interrupt` set: the reply
        so far, finish "interrupted"."""
        ids = self.prompt_ids(request)
        budget = self.n_ctx - len(ids)
        if budget < 1:
            raise ValueError(
                f"the prompt ({len(ids)} tokens) does not fit the context {self.n_ctx}"
            )
        held = self.session.tokens
        common = 0
        for a, b in zip(held, ids, strict=False):
            if a != b:
                break
            common += 1
        common = min(common, len(ids) - 1)  # at least one token evaluated: fresh logits
        self.session.rewind(common)
        self.session.eval(ids[common:])
        reply = Reply(prompt_tokens=len(ids), cached_tokens=common)
        s = request.sampling
        params = SamplingParams(temperature=s.temperature, top_k=s.top_k, top_p=s.top_p,
                                min_p=s.min_p, seed=s.seed)  # fmt: skip
        rng = make_rng(s.seed)
        decode = self.format.decode(request)
        params = decode.sampling(params)
        text_decoder = self.engine.tokenizer.incremental_decoder()
        eog = self.engine.tokenizer.eog_ids
        limit = min(budget, request.max_tokens or budget)
        names: dict[int, str] = {}

        def handle(events: list[Event]) -> None:
            for ev in events:
                if isinstance(ev, TextDelta):
                    reply.text += ev.text
                elif isinstance(ev, ReasoningDelta):
                    reply.reasoning += ev.text
                elif isinstance(ev, ToolCallStart):
                    names[ev.index] = ev.name
                elif isinstance(ev, ToolCallEnd):
                    reply.tool_calls.append((names.get(ev.index, ""), ev.arguments))
                if on_event is not None:
                    on_event(ev)

        reply.finish = "length"
        while reply.completion_tokens < limit:
            if interrupt is not None and interrupt.is_set():
                reply.finish = "interrupted"
                break
            token = sample(self.session.compute_logits(), params, rng)
            if token in eog:
                reply.finish = "stop"
                break
            self.session.eval([token])
            reply.completion_tokens += 1
            handle(decode.feed(text_decoder.feed(token)))
            if decode.stopped:
                reply.finish = "stop"
                break
        handle(decode.feed(text_decoder.flush()))
        handle(decode.flush())
        return reply

    def close(self) -> None:
        self.session.close()
