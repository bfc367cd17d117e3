"""One request, end to end, on one slot: render, sync the slot, decode, emit events.

`Generator.prepare` runs before any response byte is sent (so context overflow is still
a 400); `Generator.run` is the producer task: it streams neutral events into a memory
channel, and is cancelled (within one engine step) when the client goes away.

The state layer comes in at construction, as a `GenerationState` (the daemon passes its
ds4d.state.service.StateService): history normalised before rendering, the slot synced
through its KV state (disk cache, checkpoints), tool calls remembered for replay, and a
trace line per finished request.
"""

from __future__ import annotations

import functools
import logging
import math
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Protocol, TypeVar

import numpy as np
import trio

from ds4d.chat.constrain import Allow, Force, Step, VocabIndex
from ds4d.chat.errors import ContextExceeded, PromptRefused
from ds4d.chat.formats import ChatFormat
from ds4d.chat.types import (
    ChatRequest,
    Event,
    Finish,
    FinishReason,
    ReasoningDelta,
    TextDelta,
    ToolCallEnd,
    ToolCallStart,
    Usage,
)
from ds4d.daemon.batcher import Batcher
from ds4d.daemon.chunking import ChunkSizer
from ds4d.daemon.metrics import Metrics
from ds4d.daemon.scheduler import EngineGate, SlotPool, Ticket
from ds4d.engine.engine import Engine, Session
from ds4d.engine.infill_sampling import infill_rule_for
from ds4d.engine.sampler import SamplingParams, make_rng, sample
from ds4d.state.kvstate import KVState
from ds4d.state.matching import common_prefix
from ds4d.state.service import tool_call_ids
from ds4d.state.slots import Slot, sync_slot
from ds4d.state.trace import GenerationRecord

log = logging.getLogger("ds4d.generation")

T = TypeVar("T")

PROGRESS_LOG_S = 10.0  # a long prefill logs how far it got at most this often


class GenerationState(Protocol):
    """What one generation asks of the state layer (ds4d.state.service.StateService)."""

    @property
    def kv(self) -> KVState:
        """The slots' KV state: matching plan, disk cache, checkpoints (see sync_slot)."""
        ...

    def prepare_request(self, request: ChatRequest) -> ChatRequest:
        """The request as it must render: its history byte-stable across turns."""
        ...

    def record_output(self, record: GenerationRecord, event: Event) -> None:
        """An event this generation produced (kept for the trace when it wants text)."""
        ...

    def remember_tool_call(self, session: Session, call_id: str, arguments: str) -> None:
        """A call the model made on `session`, as sampled, for exact replay later."""
        ...

    def trace_finished(self, record: GenerationRecord, prompt: str) -> None:
        """A request that had a slot is over (blocking: the trace file)."""
        ...


@dataclass
class Job:
    request: ChatRequest
    text: str  # rendered prompt
    tokens: list[int]  # its full tokenization
    record: GenerationRecord  # what the log line, /metrics and the trace report
    arrived: float = field(default_factory=time.perf_counter)
    ticket: Ticket | None = None  # its place in the slot queue
    slot: Slot | None = None


class Generator:
    def __init__(
        self,
        engine: Engine,
        chat_format: ChatFormat,
        ctx: int,
        pool: SlotPool,
        gate: EngineGate,
        metrics: Metrics,
        state: GenerationState,
        chunks: ChunkSizer | None = None,
    ) -> None:
        self.engine = engine
        self.tok = engine.tokenizer
        self.chat_format = chat_format  # render + per-generation decode
        self.ctx = ctx
        self.pool = pool
        self.gate = gate
        self.metrics = metrics
        self.state = state
        # Decode steps of all generating slots advance together, one engine call each.
        self.batcher = Batcher(engine, gate, on_batch=metrics.count_decode_batch)
        # Prefill chunks sized by engine time: each one stalls the other slots briefly.
        self.chunks = chunks if chunks is not None else ChunkSizer()
        self._vocab: VocabIndex | None = None
        self._longest_token: int | None = None  # bytes of the vocabulary's longest token

    # -- before the response -------------------------------------------------------------

    def render(self, req: ChatRequest) -> str:
        """The prompt text of `req` (blocking: history lookups, the template)."""
        return self.chat_format.render(self.state.prepare_request(req))

    def _special(self, req: ChatRequest) -> bool:
        return self.chat_format.tokenize_special(req)

    def encode(self, text: str) -> list[int]:
        return self.tok.encode(text, special=True)

    def encode_after(self, previous: int | None, text: str) -> list[int]:
        """`text` tokenized as it reads after token `previous`: continuing a span (after
        a non-special token) it gets no SentencePiece space prefix."""
        if previous is None or self.tok.is_special(previous):
            return self.encode(text)
        return self.tok.encode_continuation(text, special=True)

    def tokenize_prompt(self, text: str, raw: bool = False) -> list[int]:
        tokens = self.tok.encode(text, special=not raw)
        bos = self.tok.bos_id
        if self.tok.add_bos and bos is not None and (not tokens or tokens[0] != bos):
            tokens.insert(0, bos)
        return tokens

    async def prepare(self, req: ChatRequest, api: str, param: str = "messages") -> Job:
        """Render and tokenize (on a worker: agent prompts are large), check the context."""

        def work() -> tuple[str, list[int]]:
            if req.prompt_ids is not None:  # assembled by the caller (FIM): no template
                ids = list(req.prompt_ids)
                return self.tok.decode(ids), ids
            text = self.render(req)
            self._refuse_if_surely_too_long(text, param)
            tokens = self.tokenize_prompt(text, raw=not self._special(req))
            prefix = req.cache_prefix
            if prefix is not None:  # Anthropic cache_control: how much of the prompt it marks
                req.cache_prefix_tokens = self._shared_prefix(prefix, tokens)
            return text, tokens

        try:
            text, tokens = await trio.to_thread.run_sync(work)
        except ValueError as e:  # the chat template refused the conversation
            raise PromptRefused(str(e), param) from None
        except ContextExceeded:
            self.metrics.rejected["context_length_exceeded"] += 1
            raise
        if not tokens:  # nothing to continue from: the model would have no logits
            raise PromptRefused("the prompt is empty", param)
        if len(tokens) >= self.ctx:
            self.metrics.rejected["context_length_exceeded"] += 1
            raise ContextExceeded(
                f"Prompt has {len(tokens)} tokens, but the configured context size is "
                f"{self.ctx} tokens",
                param,
                size=len(tokens),
                unit="tokens",
                n_ctx=self.ctx,
            )
        return Job(req, text, tokens, GenerationRecord(api, len(tokens)))

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

    # -- the producer ----------------------------------------------------------------------

    async def run(self, job: Job, send: trio.MemorySendChannel[Event]) -> None:
        """Generate into `send` once `job.ticket` grants a slot; releases the slot.

        The first event is the prompt's usage as tokenized, sent before the wait for a
        slot: a stream can open at once (Anthropic's message_start) however long the
        queue and the prefill take. Later Usage events replace it."""
        assert job.ticket is not None
        try:
            await send.send(Usage(len(job.tokens), 0))
            slot = job.slot = await job.ticket.wait()
        except BaseException as e:
            job.ticket.cancel()  # leaves the queue, or hands on a slot granted meanwhile
            send.close()  # the consumer sees the end
            if isinstance(e, trio.BrokenResourceError | trio.ClosedResourceError):
                return  # the client went away before its turn
            raise
        finish: Finish | None = None  # None: cancelled (client gone, shutdown)
        job.record.slot = slot.index
        async with send:  # closed last: a client that sees the end finds its trace line
            try:
                finish = await self._generate(job, slot, send)
            except (trio.BrokenResourceError, trio.ClosedResourceError):
                pass  # the client went away: cancelled
            except Exception:  # an engine failure ends this request, not the daemon
                log.exception("generation failed")
                finish = Finish("error", "generation failed (details are in the server log)")
                try:
                    await send.send(finish)
                except (trio.BrokenResourceError, trio.ClosedResourceError):
                    pass
            finally:
                await self._finished(job, slot, finish)

    async def _finished(self, job: Job, slot: Slot, finish: Finish | None) -> None:
        """Release the slot, then report the request: log line, /metrics, trace."""
        self.pool.release(slot)
        r = job.record
        r.finish = finish.reason if finish is not None else "cancelled"
        # One record feeds the log line, /metrics and the trace: they cannot disagree.
        self.metrics.account(r)
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
        # A file write, off the loop; shielded: a cancelled request is traced too.
        with trio.CancelScope(shield=True):
            try:
                await trio.to_thread.run_sync(self.state.trace_finished, r, job.text)
            except Exception:  # a trace failure must never break serving
                log.exception("writing the trace line failed")

    async def _generate(self, job: Job, slot: Slot, send: trio.MemorySendChannel[Event]) -> Finish:
        rec = job.record
        session = slot.session
        t0 = time.perf_counter()
        logged = [t0]
        evaluating = [False]
        whole = [False]  # the next eval is the prompt's only chunk

        def chunk_size(held: int, total: int) -> int:
            n = self.chunks.size(held, total - held)
            whole[0] = not evaluating[0] and n >= total - held
            return n

        def progress(done: int, total: int) -> None:  # long prefills say how far they are
            now = time.perf_counter()
            if now - logged[0] >= PROGRESS_LOG_S:
                logged[0] = now
                log.info(
                    "slot %d: prefill %d/%d tokens (%.0f tokens/s)",
                    slot.index,
                    done,
                    total,
                    done / (now - t0),
                )

        async def run_engine(fn: Callable[..., T], *args: object) -> T:
            # What the session held when the prefill's first evaluation began is what was
            # reused; a prefill cancelled midway is then accounted for exactly.
            if fn == session.eval and not evaluating[0]:
                evaluating[0] = True
                rec.cached_tokens = len(session.tokens)
            # Prefill work is `bulk`: the gate lets other slots' decode steps go first
            # for as long as each chunk took (see EngineGate). A prompt prefilled in one
            # chunk (a short request, a conversation's next turn) goes as decode steps
            # do, within that credit: a long prefill does not hold it up for a chunk.
            if fn != session.eval:
                return await self.gate.run(fn, *args, bulk=True)
            depth = session.n_tokens
            async with self.gate.hold(bulk=not whole[0]) as engine:
                result: T = await engine.work(fn, *args)
                self.chunks.observe(depth, session.n_tokens - depth, engine.work_s)
                self.metrics.prefill_chunks += 1
                await engine.rest()
            return result

        async def run_blocking(fn: Callable[..., T], *args: object) -> T:
            return await trio.to_thread.run_sync(fn, *args)

        try:
            sync = await sync_slot(
                slot,
                job.text,
                job.tokens,
                encode=self.encode,
                decode=self.tok.decode,
                run_engine=run_engine,
                run_blocking=run_blocking,
                kv=self.state.kv,
                tool_ids=tool_call_ids(job.request),
                on_progress=progress,
                chunk=chunk_size,
                # an editor's completion keeps any shared prefix (kv-cache-min-tokens is
                # for agents' conversations)
                min_reuse=1 if job.request.priority == "completion" else None,
            )
        except BaseException:
            rec.prefill_s = time.perf_counter() - t0
            if evaluating[0]:
                rec.prefilled_tokens = max(0, len(session.tokens) - rec.cached_tokens)
            else:
                rec.cached_tokens = 0
            raise
        t1 = time.perf_counter()
        rec.prefill_s = t1 - t0
        rec.prompt_tokens = len(sync.tokens)
        rec.cached_tokens = sync.reused
        rec.cache_source = sync.source
        rec.prefilled_tokens = len(sync.tokens) - sync.reused
        rec.miss_reason = sync.plan.miss_reason
        rec.disk_file = sync.disk_file
        await send.send(Usage(len(sync.tokens), 0, sync.reused, sync.source))
        try:
            finish, generated = await self._decode(job, slot, send)
        finally:
            rec.decode_s = time.perf_counter() - t1
        rec.generated_tokens = generated
        await send.send(Usage(len(sync.tokens), generated, sync.reused, sync.source))
        await send.send(finish)
        return finish

    async def _decode(
        self, job: Job, slot: Slot, send: trio.MemorySendChannel[Event]
    ) -> tuple[Finish, int]:
        req = job.request
        session = slot.session
        tok = self.tok
        room = slot.ctx - len(session.tokens) - 1
        budget = req.max_tokens if req.max_tokens is not None else math.inf
        constraint: Step | None = None
        step: Force | Allow | None = None
        if req.tool_choice.forced and req.tools:
            # on a worker: a format may index the vocabulary for its syntax the first time
            vocab = await self.vocab()
            constraint = await trio.to_thread.run_sync(self.chat_format.forced_call, vocab, req)
            step = next(constraint)
            # A forced call is completed past any max_tokens (it is bounded by its schema
            # and ends the generation itself): a cut-off block would come back as text.
            budget = math.inf
        budget = min(budget, room)
        parser = self.chat_format.decode(req)
        params = self._sampling(req)
        rng = self._rng(req)
        decoder = tok.incremental_decoder()
        eog = tok.eog_ids
        pending: list[int] = []  # sampled, not yet evaluated
        generated = 0
        first = True
        reason: FinishReason = "length"

        call_ids: dict[int, str] = {}
        kv = self.state.kv

        async def emit(events: list[Event]) -> None:
            nonlocal first
            for ev in events:
                self.state.record_output(job.record, ev)
                if isinstance(ev, ToolCallStart):
                    call_ids[ev.index] = ev.id
                elif isinstance(ev, ToolCallEnd) and ev.index in call_ids:
                    # exact replay of this call in later turns
                    self.state.remember_tool_call(session, call_ids[ev.index], ev.arguments)
                if first and isinstance(ev, TextDelta | ReasoningDelta | ToolCallStart):
                    first = False
                    ttft = time.perf_counter() - job.arrived
                    self.metrics.ttft.observe(ttft)
                    job.record.ttft_s = ttft
                await send.send(ev)

        # A member of the decode batch from its first step to its last: a member between
        # steps is waited for (briefly) before each batch, so it leaves as soon as it is done.
        with self.batcher.join(session) as member:
            while generated < budget:
                if isinstance(step, Force):
                    # Markup tokenized as the prompt is (chat markers as their tokens): the
                    # next turn renders this call back, and its tokens must be these.
                    held = pending or list(session.tokens[-1:])
                    ids = self.encode_after(held[-1] if held else None, step.text)
                    await member.step(pending + ids)
                    pending = []
                    generated += len(ids)
                    job.record.generated_tokens = generated
                    await emit(parser.feed(step.text))
                    assert constraint is not None  # a Force step comes from one
                    step = _advance(constraint, "")
                    if step is None:
                        reason = "tool_calls"
                        break
                    continue
                allowed = step.ids if isinstance(step, Allow) else None
                token = await member.step(
                    pending,
                    functools.partial(
                        _after_eval,
                        session,
                        bool(pending),
                        parser.sampling(params),
                        rng,
                        allowed,
                        kv,
                    ),
                )
                pending = []
                if token in eog and constraint is None:
                    reason = "stop"
                    break
                pending = [token]
                generated += 1
                job.record.generated_tokens = generated
                await emit(parser.feed(decoder.feed(token)))
                if parser.stopped:
                    reason = "stop"
                    break
                if parser.tool_block_closed:
                    reason = "tool_calls"
                    break
                if constraint is None and parser.call_opened:
                    # The model opened a call on its own: the rest is constrained to a valid
                    # call of a declared tool, as a forced call is (bounded by its schema).
                    constraint = parser.constrain_call(await self.vocab())
                    if constraint is not None:
                        step = next(constraint)
                        budget = room
                    continue
                if constraint is not None:
                    step = _advance(constraint, self._vocab_text(token))
                    if step is None:
                        reason = "tool_calls"
                        break
            if pending:  # keep the KV complete: the next turn's prompt holds this token
                await member.step(pending)
        # A character cut off by the token limit is dropped, not sent as U+FFFD: a client
        # would store the replacement and the next turn's prompt would no longer match.
        tail = decoder.flush().rstrip("\ufffd")
        if tail:
            await emit(parser.feed(tail))
        await emit(parser.flush())
        for call_id, text in parser.replay.items():  # e.g. a DS4 call's DSML, as sampled
            self.state.remember_tool_call(session, call_id, text)
        malformed = parser.malformed
        if malformed:  # the markup was dropped, never sent as text
            log.warning("slot %d: %s", slot.index, malformed)
            job.record.malformed_call = malformed
        if parser.tool_calls:
            reason = "tool_calls"
        return Finish(reason, stop_sequence=parser.stop_sequence), generated

    def _sampling(self, req: ChatRequest) -> SamplingParams:
        s = req.sampling
        return SamplingParams(
            temperature=s.temperature, top_k=s.top_k, top_p=s.top_p, min_p=s.min_p, seed=s.seed,
            infill=infill_rule_for(self.tok) if s.infill else None,
        )  # fmt: skip

    def _rng(self, req: ChatRequest) -> np.random.Generator:
        return make_rng(req.sampling.seed)

    async def vocab(self) -> VocabIndex:
        if self._vocab is None:
            self._vocab = await trio.to_thread.run_sync(self._build_vocab)
        return self._vocab

    def _build_vocab(self) -> VocabIndex:
        return VocabIndex.from_tokenizer(self.tok, self.engine.info.n_vocab)

    def _vocab_text(self, token: int) -> str | None:
        if self.tok.is_special(token):
            return None
        try:
            return self.tok.token_bytes(token).decode("utf-8")
        except UnicodeDecodeError:
            return None


def _after_eval(session: Session, evaluated: bool, params: SamplingParams, rng: np.random.Generator,
                allowed: np.ndarray | None, kv: KVState) -> int:  # fmt: skip
    """A decode step's own work once the batch has evaluated its token (engine thread)."""
    if evaluated:  # a continued checkpoint when decoding reaches a frontier
        kv.after_token(session)
    return sample(session.compute_logits(), params, rng, allowed)


def _advance(constraint: Step, text: str | None) -> Force | Allow | None:
    try:
        return constraint.send(text or "")
    except StopIteration:
        return None
