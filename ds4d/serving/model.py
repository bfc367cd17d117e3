"""One model as the daemon serves it: its engine, slots, state layer and engine loop,
behind a narrow surface.

    server = ModelServer(engine, chat_format, ctx, slots, state, gate, metrics, ...)
    nursery.start_soon(server.run)                # the engine loop, for the daemon's life
    prepared = await server.prepare(request, api) # refusals raised before any byte is sent
    async with server.generate(prepared) as events:   # Overloaded when the queue is full
        async for event in events: ...            # leaving the block cancels the request
    server.count_tokens(request)                  # blocking
    server.set_steering(steering, about)          # the next requests' steering

Several models each get their own ModelServer; they share one ComputeGate, so their
engines never compute at once.
"""

from __future__ import annotations

import logging
import time
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from typing import Any, Protocol

import trio

from ds4d.chat.errors import ContextExceeded
from ds4d.chat.formats import ChatFormat
from ds4d.chat.types import ChatRequest, Event
from ds4d.engine.engine import Engine, Session
from ds4d.engine.family import BatchedModel
from ds4d.engine.steering import Steering
from ds4d.serving.chunking import ChunkSizer
from ds4d.serving.decoding import Decoding, OutputSink
from ds4d.serving.draft import DraftModel
from ds4d.serving.gate import ComputeGate
from ds4d.serving.loop import EngineLoop
from ds4d.serving.prompt import Prepared, PromptPreparer
from ds4d.serving.slots import SlotPool
from ds4d.serving.speculation import MODES, VERIFY_ROWS, Speculation
from ds4d.serving.steering import SteeringVectors
from ds4d.serving.stepcost import StepCost
from ds4d.state.service import StateService
from ds4d.state.slots import Slot
from ds4d.state.trace import GenerationRecord

log = logging.getLogger("ds4d.generation")


class ServingMetrics(Protocol):
    """The counters serving feeds (ds4d.daemon.metrics.Metrics)."""

    def account(self, record: GenerationRecord) -> None: ...

    def count_decode_batch(self, size: int) -> None: ...

    def count_prefill_chunk(self) -> None: ...

    def observe_ttft(self, seconds: float) -> None: ...

    def count_rejected(self, reason: str) -> None: ...

    def count_completion(self, record: GenerationRecord, *, cancelled: bool) -> None: ...


class ModelServer:
    def __init__(
        self,
        engine: Engine,
        chat_format: ChatFormat,
        ctx: int,
        slots: list[Slot],
        state: StateService,
        gate: ComputeGate,
        metrics: ServingMetrics,
        *,
        completion_slots: int = 0,
        speculative: str = "off",
        draft: DraftModel | None = None,
        cost_aware: bool = True,
        queue_size: int = 16,
        chunk_target_s: float | None = None,
        clock: Callable[[], float] = time.perf_counter,
        vectors: SteeringVectors | None = None,
        steering_about: dict[str, Any] | None = None,
    ) -> None:
        """`clock` times engine work (chunk sizes, the decode credit); `speculative` is a
        mode of ds4d.serving.speculation.MODES; "draft" drafts with `draft` (a model of
        the same vocabulary: ds4d.serving.draft.check_same_vocabulary); `cost_aware`: the
        draft length weighs the measured step costs (ds4d.serving.stepcost), else the
        acceptance rate alone (for tests whose drafts must not depend on timing).
        `vectors`: the named control vectors a request may choose; `steering_about`: what
        the engine's steering (every request's that chooses none, until set_steering) was
        made from, for `steering`."""
        if speculative not in MODES:
            raise ValueError(f"speculative must be one of {', '.join(MODES)}, got {speculative!r}")
        if speculative == "draft" and draft is None:
            raise ValueError('speculative "draft" needs a draft model')
        self.engine = engine
        # Verification needs a chunk's logits bitwise token-by-token decode's: measured for
        # the attention decoders' batched forward pass (docs/speculative.md), not for
        # DeepSeek V4's own, which therefore never drafts.
        exact = isinstance(engine.model, BatchedModel)
        self.speculative = speculative != "off" and exact
        if speculative != "off" and not exact:
            log.info("speculative decoding: off (not verified exact for this family)")
        self.draft = draft if speculative == "draft" else None
        self.ctx = ctx
        self.state = state
        self.metrics = metrics
        self.chat_format = chat_format
        self.pool = SlotPool(slots, completion_slots)
        self.steering_vectors = vectors if vectors is not None else SteeringVectors({})
        self.prompts = PromptPreparer(engine.tokenizer, engine.info.n_vocab, chat_format, ctx,
                                      state, self.steering_vectors)  # fmt: skip
        sizer = ChunkSizer() if chunk_target_s is None else ChunkSizer(target_s=chunk_target_s)
        # what a decode step and a verification chunk cost here: the draft length follows
        # it (without: the acceptance rate alone, a choice that depends on no timing)
        self.step_cost = StepCost(VERIFY_ROWS) if cost_aware else None
        self.loop = EngineLoop(engine, self.pool, gate, self, kv=state.kv, sizer=sizer,
                               cost=self.step_cost, queue_size=queue_size,
                               clock=clock)  # fmt: skip
        self._sink = OutputSink(state.record_output, state.remember_tool_call,
                                metrics.observe_ttft)  # fmt: skip
        self._steering_about = steering_about if engine.steering is not None else None

    # -- the daemon's surface --------------------------------------------------------------

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        """The engine loop (until cancelled)."""
        await self.loop.run(task_status=task_status)

    async def prepare(self, req: ChatRequest, api: str, param: str = "messages") -> Prepared:
        try:
            return await self.prompts.prepare(req, api, param)
        except ContextExceeded:
            self.metrics.count_rejected("context_length_exceeded")
            raise

    def count_tokens(self, req: ChatRequest) -> int:
        return self.prompts.count_tokens(req)

    @asynccontextmanager
    async def generate(self, prepared: Prepared) -> AsyncIterator[trio.MemoryReceiveChannel[Event]]:
        """The request's events; leaving the block before the end cancels it."""
        work, events = self.loop.submit(prepared)
        try:
            yield events
        finally:
            self.loop.cancel(work)
            events.close()

    def set_steering(self, steering: Steering | None, about: dict[str, Any] | None = None
                     ) -> None:  # fmt: skip
        """The steering of the requests submitted from now on that choose none (None:
        unsteered; `about`: what it was made from, for `steering`). Requests already
        submitted keep theirs (ds4d.serving.loop)."""
        self.loop.set_steering(steering)
        self._steering_about = about if steering is not None else None

    def steering(self) -> dict[str, Any]:
        """The current steering (None when unsteered) and the vectors a request may name."""
        current = self.loop.current_steering
        shown: dict[str, Any] | None = None
        if current is not None:
            shown = {**(self._steering_about or {}), "attn": current.attn_scale,
                     "ffn": current.ffn_scale, "layers_steered": current.describe()["layers"],
                     "key": current.key}  # fmt: skip
        return {"steering": shown, "vectors": self.steering_vectors.names}

    @property
    def busy(self) -> int:
        return self.pool.busy

    @property
    def waiting(self) -> int:
        return self.loop.waiting

    # -- what the loop asks (LoopHooks) ----------------------------------------------------

    def decoding(self, prepared: Prepared, session: Session, room: int) -> Decoding:
        req = prepared.request
        spec = None
        if self.speculative and req.sampling.speculative:
            spec = Speculation(model=self.draft, seed=req.sampling.seed, cost=self.step_cost)
        return Decoding(req, session, self.engine.tokenizer, self.chat_format.decode(req),
                        prepared.record, self._sink, arrived=prepared.arrived, room=room,
                        vocab=prepared.vocab, forced=prepared.forced, answer=prepared.answer,
                        answer_after_reasoning=prepared.answer_after_reasoning,
                        speculation=spec)  # fmt: skip

    def prefill_chunk(self) -> None:
        self.metrics.count_prefill_chunk()

    def decode_batch(self, size: int) -> None:
        self.metrics.count_decode_batch(size)

    def finished(self, prepared: Prepared, slot: Slot) -> None:
        r = prepared.record
        # One record feeds the log line, /metrics and the trace: they cannot disagree.
        self.metrics.account(r)
        if prepared.request.priority == "completion":
            self.metrics.count_completion(r, cancelled=False)  # the record's finish says
        if r.malformed_call:
            log.warning("slot %d: %s", slot.index, r.malformed_call)
        log.info(
            "%s slot %d: prompt %d tokens (%d cached, %s), prefill %d tokens in "
            "%.2fs, %d generated in %.2fs, finish %s",
            r.api,
            slot.index,
            r.prompt_tokens,
            r.cached_tokens,
            r.cache_source,
            r.prefilled_tokens,
            r.prefill_s,
            r.generated_tokens,
            r.decode_s,
            r.finish,
        )
        if r.drafted_tokens:
            log.info("slot %d: speculation drafted %d tokens, accepted %d (%.0f%%)", slot.index,
                     r.drafted_tokens, r.accepted_tokens,
                     100 * r.accepted_tokens / r.drafted_tokens)  # fmt: skip

    def dropped(self, prepared: Prepared) -> None:
        if prepared.request.priority == "completion":
            self.metrics.count_completion(prepared.record, cancelled=True)

    def trace(self, prepared: Prepared) -> None:
        self.state.trace_finished(prepared.record, prepared.text)
