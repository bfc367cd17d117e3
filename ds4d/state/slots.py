"""Resident KV slots and the one step that brings a slot's session to a new prompt.

A slot is one live engine Session plus bookkeeping. `sync_slot` decides, through the
matching order of `ds4d.state.matching.plan_sync` (memory-token, memory-text, disk-text,
none), how much of what the slot holds can be kept, then prefills the rest in chunks.
Engine work goes through `run_engine`, an awaitable the daemon supplies (worker thread,
engine lock, power pacing), so this module stays free of any event-loop choice.
"""

from __future__ import annotations

import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from ds4d.state.matching import Decode, Encode, Plan, plan_sync

RunEngine = Callable[..., Awaitable[Any]]  # run_engine(fn, *args) -> fn(*args) on a worker

PREFILL_CHUNK = 256  # tokens per engine call: between chunks other slots get a turn


@dataclass
class Slot:
    index: int
    session: Any  # ds4d.engine Session
    ctx: int
    busy: bool = False
    last_used: float = field(default_factory=time.monotonic)
    requests: int = 0

    @property
    def tokens(self) -> Sequence[int]:
        return self.session.tokens

    def describe(self) -> dict[str, Any]:
        return {"id": self.index, "state": "busy" if self.busy else "idle",
                "tokens": len(self.session.tokens), "ctx": self.ctx,
                "requests": self.requests,
                "idle_s": 0.0 if self.busy else round(time.monotonic() - self.last_used, 1)}


@dataclass
class SyncResult:
    tokens: list[int]  # the prompt as the session now holds it (the effective prompt)
    reused: int  # prompt tokens kept from before (cached)
    source: str  # memory-token | memory-text | disk-text | none
    plan: Plan


async def sync_slot(
    slot: Slot,
    prompt_text: str,
    prompt_tokens: Sequence[int],
    *,
    encode: Encode,
    decode: Decode,
    run_engine: RunEngine,
    lookup: Callable[[str], Any] | None = None,
    load_disk: Callable[[Slot, Any], list[int] | None] | None = None,
    save_evict: Callable[[Slot], None] | None = None,
    on_progress: Callable[[int, int], None] | None = None,
    chunk: int = PREFILL_CHUNK,
) -> SyncResult:
    """Make `slot.session` hold the prompt (and its next-token logits).

    `lookup`/`load_disk`/`save_evict` plug in the disk cache: lookup(text) finds a
    checkpoint, load_disk(slot, match) loads it into the session (run on a worker) and
    returns the effective prompt tokens or None on failure, save_evict(slot) saves what
    the slot is about to lose."""
    session = slot.session
    live = list(session.tokens)
    plan = plan_sync(live, prompt_text, prompt_tokens, decode=decode, encode=encode,
                     lookup=lookup if load_disk is not None else None)
    if plan.evict_save and save_evict is not None:
        await run_engine(save_evict, slot)

    tokens: list[int] | None = plan.tokens
    reused, source = plan.keep, plan.source
    if plan.disk is not None and load_disk is not None:
        tokens = await run_engine(load_disk, slot, plan.disk)
        if tokens is None:  # a bad file: logged by the cache, the request goes on cold
            tokens, reused, source = list(prompt_tokens), 0, "none"
            await run_engine(session.rewind, 0)
        else:
            reused = len(session.tokens)
    elif plan.keep < len(live):
        await run_engine(session.rewind, plan.keep)
    assert tokens is not None

    done = len(session.tokens)
    total = len(tokens)
    while done < total:
        step = tokens[done : done + chunk]
        await run_engine(session.eval, step)
        done += len(step)
        if on_progress is not None:
            on_progress(done, total)
    return SyncResult(tokens, min(reused, total), source, plan)
