"""Prompt preparation: a request rendered by the model's chat format, tokenized, and
refused when it cannot run (before any response byte is sent: a too-long prompt is still
a 400). Blocking work (rendering, tokenizing) runs on a worker thread."""

from __future__ import annotations

import time
from dataclasses import dataclass, field

import trio

from ds4d.chat.constrain import Step, VocabIndex
from ds4d.chat.errors import ContextExceeded, PromptRefused
from ds4d.chat.formats import ChatFormat
from ds4d.chat.structured import JsonVocab, json_output
from ds4d.chat.toolsyntax import prefixed
from ds4d.chat.types import ChatRequest
from ds4d.engine.steering import Steering
from ds4d.engine.tokenizer_api import ModelTokenizer
from ds4d.serving.constraint import CallConstraint
from ds4d.serving.steering import SteeringVectors
from ds4d.state.matching import common_prefix
from ds4d.state.service import StateService
from ds4d.state.trace import GenerationRecord


@dataclass
class Prepared:
    """A request ready for the engine loop."""

    request: ChatRequest
    text: str  # rendered prompt
    tokens: list[int]  # its full tokenization
    record: GenerationRecord  # what the log line, /metrics and the trace report
    vocab: VocabIndex | None = None  # for a tool-call constraint (tools declared)
    forced: CallConstraint | None = None  # the constraint of a forced tool call
    # A structured answer (request.output_format): its JSON steps, and whether they wait
    # for the model to close the thinking block the prompt opened.
    answer: Step | None = None
    answer_after_reasoning: bool = False
    # The request's own steering (`steered`; None then: unsteered), else the model's
    # current one, taken when the loop accepts it (ds4d.serving.loop).
    steering: Steering | None = None
    steered: bool = False
    arrived: float = field(default_factory=time.perf_counter)


class PromptPreparer:
    def __init__(
        self, tokenizer: ModelTokenizer, n_vocab: int, chat_format: ChatFormat, ctx: int,
        state: StateService, vectors: SteeringVectors | None = None,
    ) -> None:  # fmt: skip
        """`vectors`: the named control vectors a request may choose (none: a request
        naming one is refused)."""
        self.tok = tokenizer
        self.steering_vectors = vectors if vectors is not None else SteeringVectors({})
        self.n_vocab = n_vocab
        self.chat_format = chat_format
        self.ctx = ctx
        self.state = state
        self._vocab: VocabIndex | None = None
        self._json_vocabs: dict[str, JsonVocab] = {}
        self._longest_token: int | None = None  # bytes of the vocabulary's longest token

    def render(self, req: ChatRequest) -> str:
        """The prompt text of `req` (blocking: history lookups, the template)."""
        return self.chat_format.render(self.state.prepare_request(req))

    def tokenize_prompt(self, text: str, raw: bool = False) -> list[int]:
        tokens = self.tok.encode(text, special=not raw)
        bos = self.tok.bos_id
        if self.tok.add_bos and bos is not None and (not tokens or tokens[0] != bos):
            tokens.insert(0, bos)
        return tokens

    async def prepare(self, req: ChatRequest, api: str, param: str = "messages") -> Prepared:
        """Render and tokenize (on a worker: agent prompts are large), check the context;
        a request with tools gets the vocabulary index its tool-call constraint needs."""

        def work() -> Prepared:
            if req.prompt_ids is not None:  # assembled by the caller (FIM): no template
                ids = list(req.prompt_ids)
                text = self.tok.decode(ids)
            else:
                text = self.render(req)
                self._refuse_if_surely_too_long(text, param)
                ids = self.tokenize_prompt(text, raw=not self._special(req))
                prefix = req.cache_prefix
                if prefix is not None:  # Anthropic cache_control: the prompt's part it marks
                    req.cache_prefix_tokens = self._shared_prefix(prefix, ids)
            self._refuse_if_too_long(ids, param)
            prepared = Prepared(req, text, ids, GenerationRecord(api, len(ids)))
            if req.steering is not None:
                prepared.steering = self.steering_vectors.resolve(req.steering)
                prepared.steered = True
            if req.tools_active:
                vocab = prepared.vocab = self.vocab()
                if req.tool_choice.forced:
                    # a format may index the vocabulary for its syntax the first time
                    steps = self.chat_format.forced_call(vocab, req)
                    prepared.forced = CallConstraint(steps)
            if req.output_format is not None and prepared.forced is None:
                start = self.chat_format.structured_start(req)
                answer = json_output(self.json_vocab(start.markup), req.output_format)
                if start.prefix is None:
                    prepared.answer_after_reasoning = True
                elif start.prefix:
                    answer = prefixed(start.prefix, answer)
                prepared.answer = answer
            return prepared

        try:
            return await trio.to_thread.run_sync(work)
        except ValueError as e:  # the chat template refused the conversation
            raise PromptRefused(str(e), param) from None

    def _special(self, req: ChatRequest) -> bool:
        return self.chat_format.tokenize_special(req)

    def _refuse_if_too_long(self, tokens: list[int], param: str) -> None:
        if not tokens:  # nothing to continue from: the model would have no logits
            raise PromptRefused("the prompt is empty", param)
        if len(tokens) >= self.ctx:
            raise ContextExceeded(
                f"Prompt has {len(tokens)} tokens, but the configured context size is "
                f"{self.ctx} tokens",
                param,
                size=len(tokens),
                unit="tokens",
                n_ctx=self.ctx,
            )

    def _shared_prefix(self, prefix: ChatRequest, tokens: list[int]) -> int:
        """Tokens of `tokens` that the rendering of the shorter conversation `prefix` also
        starts with: the part of the prompt that conversation covers."""
        head = self.tokenize_prompt(self.render(prefix), raw=not self._special(prefix))
        return common_prefix(head, tokens)

    def _refuse_if_surely_too_long(self, text: str, param: str) -> None:
        """A prompt whose bytes cannot fit in the context is refused before tokenizing: a
        tokenizer pass over megabytes costs seconds and memory for a certain refusal.
        No token stands for more than `_max_token_bytes()` bytes; the factor 2 leaves room
        for normalizers that shorten text before it is split."""
        limit = 2 * self.ctx * self._max_token_bytes()
        size = len(text.encode("utf-8", errors="replace"))
        if size > limit:
            raise ContextExceeded(
                f"Prompt has {size} bytes, more than the configured context of {self.ctx} "
                f"tokens can hold",
                param,
                size=size,
                unit="bytes",
                n_ctx=self.ctx,
            )

    def _max_token_bytes(self) -> int:
        if self._longest_token is None:
            longest = 1
            for i in range(self.tok.n_vocab):
                try:
                    longest = max(longest, len(self.tok.token_bytes(i) or b""))
                except ValueError:
                    continue
            self._longest_token = longest
        return self._longest_token

    def count_tokens(self, req: ChatRequest) -> int:
        """The prompt's token count (blocking: run it on a worker). A prompt whose bytes
        cannot fit the context is refused before tokenizing, as `prepare` does: counting
        megabytes would hold a worker and memory for seconds. A count above the context
        is still given: clients ask it to decide what to trim."""
        try:
            text = self.render(req)
        except ValueError as e:  # the chat template refused the conversation
            raise PromptRefused(str(e), "messages") from None
        self._refuse_if_surely_too_long(text, "messages")
        return len(self.tokenize_prompt(text, raw=not self._special(req)))

    def vocab(self) -> VocabIndex:
        """The vocabulary index of tool-call constraints (blocking the first time)."""
        if self._vocab is None:
            self._vocab = VocabIndex.from_tokenizer(self.tok, self.n_vocab)
        return self._vocab

    def json_vocab(self, markup: str) -> JsonVocab:
        """The token classes of structured answers whose strings exclude `markup`
        (blocking the first time for each)."""
        if markup not in self._json_vocabs:
            vocab = self.vocab()
            self._json_vocabs[markup] = JsonVocab(vocab.with_markup(markup) if markup else vocab)
        return self._json_vocabs[markup]
