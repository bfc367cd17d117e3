"""Resident KV slots and the one step that brings a slot's session to a new prompt.

A slot is one live engine Session plus bookkeeping. `sync_slot` decides, through the
matching order of `ds4d.state.matching.plan_sync` (memory-token, memory-text, disk-text,
none), how much of what the slot holds can be kept, then prefills the rest in chunks.
Engine work goes through `run_engine`, an awaitable the daemon supplies (worker thread,
engine lock, power pacing), and the rest of the blocking work (the matching plan: key
texts, hashing the prompt against the disk cache) through `run_blocking` (a worker thread
outside the engine gate), so this module stays free of any event-loop choice.
"""

from __future__ import annotations

import time
from collections.abc import Awaitable, Callable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol, TypeVar

from ds4d.engine.engine import Session
from ds4d.state.kvstate import KVState
from ds4d.state.matching import Decode, Encode, Plan, plan_sync
from ds4d.state.trace import CacheSource

T = TypeVar("T")


class RunBlocking(Protocol):
    """`await run(fn, *args)`: fn(*args) where it may block (a worker thread)."""

    def __call__(self, fn: Callable[..., T], *args: object) -> Awaitable[T]: ...


async def run_here(fn: Callable[..., T], *args: object) -> T:
    """A RunBlocking for callers with nothing else to do meanwhile (tests, one-shot tools)."""
    return fn(*args)


PREFILL_CHUNK = 256  # tokens per engine call: between chunks other slots get a turn
ChunkSize = Callable[[int, int], int]  # (tokens held, tokens wanted) -> next chunk's size


@dataclass
class Slot:
    index: int
    session: Session
    ctx: int
    busy: bool = False
    last_used: float = field(default_factory=time.monotonic)
    requests: int = 0

    @property
    def tokens(self) -> Sequence[int]:
        return self.session.tokens

    def describe(self) -> dict[str, Any]:
        return {
            "id": self.index,
            "state": "busy" if self.busy else "idle",
            "tokens": self.session.n_tokens,
            "ctx": self.ctx,
            "requests": self.requests,
            "idle_s": 0.0 if self.busy else round(time.monotonic() - self.last_used, 1),
        }


@dataclass
class SyncResult:
    tokens: list[int]  # the prompt as the session now holds it (the effective prompt)
    reused: int  # prompt tokens kept from before (cached)
    source: CacheSource
    plan: Plan
    disk_file: str | None = None  # the KV file a disk-text hit loaded


async def sync_slot(
    slot: Slot,
    prompt_text: str,
    prompt_tokens: Sequence[int],
    *,
    encode: Encode,
    decode: Decode,
    run_engine: RunBlocking,
    run_blocking: RunBlocking = run_here,
    kv: KVState | None = None,
    tool_ids: Iterable[str] = (),
    on_progress: Callable[[int, int], None] | None = None,
    chunk: int | ChunkSize = PREFILL_CHUNK,
    min_reuse: int | None = None,
) -> SyncResult:
    """Make `slot.session` hold the prompt (and its next-token logits).

    `kv` plugs in the disk cache (ds4d.state.kvstate): the plan includes a disk lookup,
    a long live session about to be replaced is saved first (evict), a disk hit is
    loaded on a worker, and the prefill pauses at the cold boundary and at continued
    frontiers to write those checkpoints. `tool_ids`: the conversation's tool-call ids,
    stored with its checkpoints for exact replay after a restart. `chunk`: tokens per
    prefill call, or what gives them before each call from the tokens held and the
    prompt's length (the daemon sizes chunks by engine time). `min_reuse`: the shortest
    shared prefix kept, when not the KV state's policy (kv-cache-min-tokens)."""
    session = slot.session
    live = session.tokens
    if kv is not None:
        # the slot is ours: its session holds still while the plan is made on a worker
        plan = await run_blocking(kv.plan, session, prompt_text, prompt_tokens, min_reuse)
        if plan.evict_save:
            await run_engine(kv.save_evict, session)
        kv.begin(session, plan.source, tool_ids)
    else:
        plan = await run_blocking(
            lambda: plan_sync(live, prompt_text, prompt_tokens, decode=decode, encode=encode)
            if min_reuse is None
            else plan_sync(live, prompt_text, prompt_tokens, decode=decode, encode=encode,
                           min_tokens=min_reuse)
        )  # fmt: skip

    tokens: list[int] | None = plan.tokens
    reused, source = plan.keep, plan.source
    disk_file: str | None = None
    if plan.disk is not None and kv is not None:
        tokens = await run_engine(kv.load_disk, session, plan.disk, prompt_text)
        if tokens is None:  # a bad file: logged by the cache, the request goes on cold
            tokens, reused, source = list(prompt_tokens), 0, "none"
            await run_engine(session.rewind, 0)
        else:
            reused, disk_file = len(session.tokens), plan.disk.path.name
    elif plan.keep < len(live):
        await run_engine(session.rewind, plan.keep)
    assert tokens is not None

    done = len(session.tokens)
    total = len(tokens)
    stops = kv.stops(done, total, reused) if kv is not None else []
    while done < total:
        limit = next((p for p, _ in stops if p > done), total)
        size = chunk if isinstance(chunk, int) else chunk(done, total)
        step = tokens[done : min(done + max(1, size), limit)]
        await run_engine(session.eval, step)
        done += len(step)
        for position, reason in stops:
            if position == done and kv is not None:
                await run_engine(kv.checkpoint, session, reason)
        if on_progress is not None:
            on_progress(done, total)
    return SyncResult(tokens, min(reused, total), source, plan, disk_file)
