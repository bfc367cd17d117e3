"""Serving embeddings: inputs -> token lists (on a worker thread) -> vectors, with the
inputs of every request waiting at the time batched into prefill-sized forward calls.

`EmbeddingService.embed` queues a request's token lists; whichever request finds no batch
running drains the queue: it takes every queued input (its own and those of requests that
arrived meanwhile), groups them into calls (ds4d.engine.embedding.plan_calls: at most
`max_batch` inputs and EMBED_CALL_ROWS rows each), and runs each call as one turn of the
compute gate the models' engine loops share, so the chat slots' steps get their turns
between calls (the gate is fair) and the power governor's rest applies to it too.
Each row of a call is computed as its input alone computes it, so a vector never depends on
the batching. No chat slot, prefix or checkpoint is touched: the states are throwaway.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np
import trio

from ds4d.api.embeddings import EmbedRequest
from ds4d.chat.errors import ContextExceeded, PromptRefused
from ds4d.engine.embedding import EMBED_CALL_ROWS, plan_calls
from ds4d.engine.engine import Engine
from ds4d.engine.family import EmbeddingModel
from ds4d.serving.gate import ComputeGate


@dataclass
class _Pending:
    tokens: list[list[int]]
    vectors: np.ndarray | None = None
    error: BaseException | None = None
    done: trio.Event = field(default_factory=trio.Event)


class EmbeddingService:
    def __init__(self, engine: Engine, gate: ComputeGate, ctx: int) -> None:
        self.engine = engine
        self.gate = gate
        self.ctx = ctx
        self._queue: list[_Pending] = []
        self._draining = False

    # -- refusals ---------------------------------------------------------------------------

    def refusal(self) -> str | None:
        """Why this model cannot embed (one line), or None."""
        if not isinstance(self.engine.model, EmbeddingModel):
            return f"the {self.engine.info.family} family has no embedding path"
        if self.engine.embedding.pooling is None:
            return (
                f"{self.engine.info.name or 'this model'} is a generation model with no"
                " pooling declared; start ds4d with --pooling mean|cls|last to embed with it"
            )
        return None

    # -- tokens -----------------------------------------------------------------------------

    def tokenize(self, req: EmbedRequest) -> list[list[int]]:
        """Each input's tokens (texts as llama.cpp tokenizes an embedding input), cut to
        the context when the request allows it (keeping a final EOS the model pools on),
        else ContextExceeded saying by how much. Runs on a worker thread."""
        engine = self.engine
        n_vocab = engine.info.n_vocab
        eos = engine.embedding.end_id
        out = []
        for i, item in enumerate(req.inputs):
            where = f"{req.param}[{i}]" if len(req.inputs) > 1 else req.param
            if isinstance(item, str):
                ids = engine.embedding_tokens(item)
            else:
                ids = list(item)
                bad = [t for t in ids if t >= n_vocab]
                if bad:
                    raise PromptRefused(
                        f"{where}: token id {bad[0]} is outside the vocabulary (0..{n_vocab - 1})",
                        req.param,
                    )
            if not ids:
                raise PromptRefused(f"{where} has no tokens to embed", req.param)
            if len(ids) > self.ctx:
                if not req.truncate:
                    raise ContextExceeded(
                        f"{where} has {len(ids)} tokens, {len(ids) - self.ctx} more than the"
                        f" context of {self.ctx}; shorten it or send truncate: true",
                        req.param, size=len(ids), unit="tokens", n_ctx=self.ctx,
                    )  # fmt: skip
                ids = ids[: self.ctx]
                if eos is not None and isinstance(item, str):
                    ids[-1] = eos
            out.append(ids)
        return out

    # -- vectors ----------------------------------------------------------------------------

    async def embed(self, token_lists: list[list[int]]) -> np.ndarray:
        """The pooled, normalised vectors of token_lists (checked by `tokenize`), batched
        with whatever other requests are waiting."""
        if not token_lists:
            return np.empty((0, self.engine.info.n_embd), np.float32)
        mine = _Pending(token_lists)
        self._queue.append(mine)
        if not self._draining:
            self._draining = True
            try:
                # Shielded: the other requests in the batch wait on this drain, so a client
                # that goes away does not abandon them; it costs at most the queued work.
                with trio.CancelScope(shield=True):
                    await self._drain()
            finally:
                self._draining = False
        await mine.done.wait()
        if mine.error is not None:
            raise mine.error
        assert mine.vectors is not None
        return mine.vectors

    async def _drain(self) -> None:
        while self._queue:
            batch, self._queue = self._queue, []
            flat: list[list[int]] = [t for p in batch for t in p.tokens]
            try:
                vectors = await self._compute(flat)
            except BaseException as e:  # every waiter learns of it, then it propagates
                for p in batch:
                    p.error = e
                    p.done.set()
                if not isinstance(e, Exception):
                    raise
                continue
            row = 0
            for p in batch:
                p.vectors = vectors[row : row + len(p.tokens)]
                row += len(p.tokens)
                p.done.set()

    async def _compute(self, flat: Sequence[list[int]]) -> np.ndarray:
        out = np.empty((len(flat), self.engine.info.n_embd), np.float32)
        batch = getattr(self.engine.model, "max_batch", 1)
        for call in plan_calls([len(t) for t in flat], batch, EMBED_CALL_ROWS):
            group = [flat[i] for i in call]
            async with self.gate.turn():
                t0 = time.perf_counter()
                out[call] = await trio.to_thread.run_sync(self.engine.embed, group)
                await self.gate.rest(time.perf_counter() - t0)
        return out
