"""One request's decode, step by step: what each engine step evaluates and samples for it,
and the events its tokens become.

The engine loop (ds4d.serving.loop) asks every decoding request for its `step()` (the
tokens it has sampled or been forced to write but not yet evaluated, and whether a token
is to be sampled after them, from which ids), evaluates all of them in one batched call,
samples, and hands each its token with `after(token)`, which runs the output pipeline
(incremental detokenizer, the chat format's parser: stop strings, thinking, tool calls)
and returns the events. Both run on the engine's thread, between batches, so the loop
itself never does work that grows with the output. `finish()` ends it: the text held back
is flushed and the final events made.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from ds4d.chat.constrain import Allow, Force, Step, VocabIndex
from ds4d.chat.formats import TemplateDecode
from ds4d.chat.types import (
    ChatRequest,
    Event,
    Finish,
    FinishReason,
    ReasoningDelta,
    TextDelta,
    ToolCallEnd,
    ToolCallStart,
)
from ds4d.engine.engine import Session
from ds4d.engine.infill_sampling import infill_rule_for
from ds4d.engine.sampler import SamplingParams, make_rng
from ds4d.engine.tokenizer_api import ModelTokenizer
from ds4d.serving.constraint import CallConstraint
from ds4d.serving.speculation import Speculation
from ds4d.state.trace import GenerationRecord


@dataclass(frozen=True)
class DecodeStep:
    tokens: list[int]  # to evaluate (none for the first step: the prefill left the logits)
    sample: bool  # a token is sampled after them
    params: SamplingParams
    allowed: np.ndarray | None  # the ids a constraint allows, or None for all


class OutputSink:
    """Where a generation's events are reported besides its stream (the state layer's
    trace and tool-call memory, time to first token); see ds4d.serving.model."""

    def __init__(
        self,
        record_output: Callable[[GenerationRecord, Event], None],
        remember_tool_call: Callable[[Session, str, str], None],
        first_token: Callable[[float], None],
    ) -> None:
        self.record_output = record_output
        self.remember_tool_call = remember_tool_call
        self.first_token = first_token


class Decoding:
    def __init__(
        self,
        request: ChatRequest,
        session: Session,
        tokenizer: ModelTokenizer,
        parser: TemplateDecode,
        record: GenerationRecord,
        sink: OutputSink,
        *,
        arrived: float,
        room: int,
        vocab: VocabIndex | None = None,
        forced: CallConstraint | None = None,
        answer: Step | None = None,
        answer_after_reasoning: bool = False,
        speculation: Speculation | None = None,
    ) -> None:
        self.request = request
        self.session = session
        self.tok = tokenizer
        self.parser = parser
        self.record = record
        self.sink = sink
        self.arrived = arrived
        self.room = room
        self.vocab = vocab
        self.constraint = forced
        # What a finished constraint ends the generation with: a tool call's block, or
        # a structured answer's JSON value (then the answer is complete: "stop").
        self._constraint_end: FinishReason = "tool_calls"
        # A structured answer that starts once the model closes its thinking block.
        self._answer: Step | None = None
        if answer is not None and forced is None:
            if answer_after_reasoning:
                self._answer = answer
            else:
                self._start_answer(answer)
        budget = request.max_tokens if request.max_tokens is not None else math.inf
        if forced is not None:
            # A forced call is completed past any max_tokens (it is bounded by its schema
            # and ends the generation itself): a cut-off block would come back as text.
            budget = math.inf
        self.budget = min(budget, room)
        s = request.sampling
        self.params = SamplingParams(temperature=s.temperature, top_k=s.top_k, top_p=s.top_p,
                                     min_p=s.min_p, seed=s.seed,
                                     infill=infill_rule_for(tokenizer) if s.infill else None)  # fmt: skip
        self.rng = make_rng(s.seed)
        self.decoder = tokenizer.incremental_decoder()
        self.eog = tokenizer.eog_ids
        self.pending: list[int] = []  # sampled, not yet evaluated
        self.output_ids: list[int] = []  # every token generated, sampled or forced
        self.n_prompt = session.n_tokens  # what the session held when decoding began
        self.speculation = speculation
        self.generated = 0
        self.reason: FinishReason = "length"
        self.ending = False  # no more sampling: the pending tokens are evaluated, then done
        self.done = False
        self._forcing: list[int] = []
        self._forced_cut = False  # the forced text was cut at the token budget
        self._call_ids: dict[int, str] = {}
        self._first = True
        self._keep: int | None = None  # the session's length once done (a cut reply)
        if self.budget <= 0:  # max_tokens 0: nothing to sample
            self.ending = self.done = True

    # -- one step ---------------------------------------------------------------------------

    def step(self) -> DecodeStep:
        """What the next batch does for this request (engine thread)."""
        if self.ending:
            return DecodeStep(self.pending, False, self.params, None)
        current = self.constraint.current if self.constraint is not None else None
        if isinstance(current, Force):
            # Markup tokenized as the prompt is (chat markers as their tokens): the next
            # turn renders this call back, and its tokens must be these.
            held = self.pending or list(self.session.tokens[-1:])
            self._forcing = self._encode_after(held[-1] if held else None, current.text)
            room = self.budget - self.generated
            if len(self._forcing) > room:  # a structured answer's budget ends inside it
                self._forcing = self._forcing[: int(room)]
                self._forced_cut = True
            return DecodeStep(self.pending + self._forcing, False, self.params, None)
        params, allowed = self._sampling(current)
        return DecodeStep(self.pending, True, params, allowed)

    def sampling_next(self) -> tuple[SamplingParams, np.ndarray | None] | None:
        """How the next token is sampled, or None when the next step samples nothing (the
        generation is ending, or a call's markup is forced): speculation's verification
        samples each drafted position as a step would."""
        if self.ending:
            return None
        current = self.constraint.current if self.constraint is not None else None
        return None if isinstance(current, Force) else self._sampling(current)

    def _sampling(self, current: Allow | None) -> tuple[SamplingParams, np.ndarray | None]:
        return self.parser.sampling(self.params), current.ids if current is not None else None

    def evaluated(self) -> None:
        """The pending token is in the session already (a verified draft token): the next
        step has nothing to evaluate for it, and an ending generation is done."""
        self.pending = []
        if self.ending:
            self.done = True

    def after(self, token: int | None) -> list[Event]:
        """The step was evaluated, and `token` sampled if it asked for one (engine thread):
        the events it makes."""
        self.pending = []
        if self.ending:
            self.done = True
            return []
        events: list[Event] = []
        if token is None:  # a forced piece of a call
            assert self.constraint is not None and isinstance(self.constraint.current, Force)
            text = self.constraint.current.text
            if self._forced_cut:  # only the tokens the budget left were written
                text = self.tok.decode(self._forcing)
            self.generated += len(self._forcing)
            self.output_ids += self._forcing
            self._forcing = []
            if self._forced_cut:
                self.record.generated_tokens = self.generated
                return events + self._emit(self.parser.feed(text)) + self._end("length")
            events += self._emit(self.parser.feed(text))
            self.constraint.advance("")
            if self.constraint.done:
                return events + self._end(self._constraint_end)
        else:
            if token in self.eog and self.constraint is None:
                return events + self._end("stop")
            self.pending = [token]
            self.generated += 1
            self.output_ids.append(token)
            events += self._emit(self.parser.feed(self.decoder.feed(token)))
            if self.parser.stopped:
                return events + self._end("stop")
            if self.parser.tool_block_closed:
                return events + self._end("tool_calls")
            if self._answer is not None and not self.parser.in_reasoning:
                # the thinking block is closed: the answer is the JSON from here on
                self._start_answer(self._answer)
                self._answer = None
            elif self.constraint is None and self.parser.call_opened and self.vocab is not None:
                # The model opened a call on its own: the rest is constrained to a valid
                # call of a declared tool, as a forced call is (bounded by its schema).
                steps = self.parser.constrain_call(self.vocab)
                if steps is not None:
                    self.constraint = CallConstraint(steps)
                    self.budget = self.room
                    if self.constraint.done:
                        return events + self._end("tool_calls")
                    return events
            elif self.constraint is not None:
                self.constraint.advance(self._vocab_text(token))
                if self.constraint.done:
                    return events + self._end(self._constraint_end)
        self.record.generated_tokens = self.generated
        if self.generated >= self.budget:
            return events + self._end("length")
        return events

    def _start_answer(self, answer: Step) -> None:
        """Constrain the rest to the structured answer; its end ends the generation (its
        budget stays the client's: a cut-off answer finishes with "length")."""
        self.constraint = CallConstraint(answer)
        self._constraint_end = "stop"

    def _end(self, reason: FinishReason) -> list[Event]:
        self.reason = reason
        self.ending = True
        self.record.generated_tokens = self.generated
        marker = self.parser.cut_marker if reason == "stop" else None
        if marker:
            self._drop_undelivered(marker)
        if not self.pending:  # else one more step keeps the KV complete: the next turn's
            self.done = True  # prompt holds this token
        return []

    def _drop_undelivered(self, marker: str) -> None:
        """The reply was cut at `marker` inside the generated text: the client never gets
        it, so its next turn's prompt does not hold it. The KV is to keep only the tokens
        whose text is a prefix of what was delivered (whitespace before the marker dropped
        too: a template may trim it), so that the slot's state, and every checkpoint of
        it, is a prefix of the conversation the client sends back. The session is rewound
        by `drop_undelivered` once the step is over (a verification chunk rewinds it too)."""
        raw = self.tok.decode(self.output_ids)
        at = raw.rfind(marker)
        if at < 0:  # the marker's text is not what the tokens spell (cannot happen)
            return
        delivered = raw[:at].rstrip()
        keep = len(self.output_ids)
        while keep and not (len(text := self.tok.decode(self.output_ids[:keep])) <= len(delivered)
                            and delivered.startswith(text)):  # fmt: skip
            keep -= 1
        self.pending = []  # the token that completed the marker is not evaluated
        self._keep = self.n_prompt + keep

    def drop_undelivered(self) -> None:
        """A finished generation cut inside its text: the KV after what was delivered is
        dropped (engine thread)."""
        if self._keep is not None and self.session.n_tokens > self._keep:
            self.session.rewind(self._keep)

    # -- the end ----------------------------------------------------------------------------

    def finish(self) -> tuple[list[Event], Finish]:
        """The text held back and the final events (engine thread or loop: no engine work)."""
        events: list[Event] = []
        # A character cut off by the token limit is dropped, not sent as U+FFFD: a client
        # would store the replacement and the next turn's prompt would no longer match.
        tail = self.decoder.flush().rstrip("\ufffd")
        if tail:
            events += self._emit(self.parser.feed(tail))
        events += self._emit(self.parser.flush())
        for call_id, text in self.parser.replay.items():  # e.g. a DS4 call's DSML, as sampled
            self.sink.remember_tool_call(self.session, call_id, text)
        malformed = self.parser.malformed
        if malformed:  # dropped, or sent as text where the syntax does so (DSML)
            self.record.malformed_call = malformed
        reason = "tool_calls" if self.parser.tool_calls else self.reason
        return events, Finish(reason, stop_sequence=self.parser.stop_sequence)

    def _emit(self, events: list[Event]) -> list[Event]:
        for ev in events:
            self.sink.record_output(self.record, ev)
            if isinstance(ev, ToolCallStart):
                self._call_ids[ev.index] = ev.id
            elif isinstance(ev, ToolCallEnd) and ev.index in self._call_ids:
                # exact replay of this call in later turns
                self.sink.remember_tool_call(self.session, self._call_ids[ev.index], ev.arguments)
            if self._first and isinstance(ev, TextDelta | ReasoningDelta | ToolCallStart):
                self._first = False
                ttft = time.perf_counter() - self.arrived
                self.record.ttft_s = ttft
                self.sink.first_token(ttft)
        return events

    def _encode_after(self, previous: int | None, text: str) -> list[int]:
        """`text` tokenized as it reads after token `previous`: continuing a span (after
        a non-special token) it gets no SentencePiece space prefix."""
        if previous is None or self.tok.is_special(previous):
            return self.tok.encode(text, special=True)
        return self.tok.encode_continuation(text, special=True)

    def _vocab_text(self, token: int) -> str | None:
        if self.tok.is_special(token):
            return None
        try:
            return self.tok.token_bytes(token).decode("utf-8")
        except UnicodeDecodeError:
            return None
