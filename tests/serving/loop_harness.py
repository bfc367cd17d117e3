"""A model server on the fake compute (tests/serving/fake_engine.py), optionally with a
draft model on the same compute, and what the loop tests do with it: prompts of a given
length, requests, reading a request's events with the engine time each one arrived at."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

import trio
from trio.testing import MockClock

from ds4d.chat.formats import chat_format_for
from ds4d.chat.types import ChatRequest, Event, Finish, Priority, Sampling, TextDelta
from ds4d.daemon.metrics import Metrics
from ds4d.engine.engine import Engine
from ds4d.serving.draft import DraftModel
from ds4d.serving.gate import ComputeGate
from ds4d.serving.model import ModelServer
from ds4d.serving.prompt import Prepared
from ds4d.state.service import StateService
from ds4d.state.slots import Slot
from tests.serving.fake_engine import FakeCompute, Pass, fake_engine


def make_server(real: Engine, compute: FakeCompute, *, slots: int = 2, completion_slots: int = 0,
                ctx: int = 8192, queue_size: int = 4, gate: ComputeGate | None = None,
                target_s: float = 0.25, draft: DraftModel | None = None) -> ModelServer:  # fmt: skip
    """With `draft`, the server speculates in "draft" mode, its draft length from the
    acceptance rate alone (no step cost: what it drafts depends on no timing)."""
    engine = fake_engine(real, compute)
    sessions = [Slot(i, engine.new_session(ctx), ctx) for i in range(slots)]
    state = StateService.create(tokenizer=engine.tokenizer, fingerprint="fake", ctx=ctx,
                                kv_dir=None)  # fmt: skip
    return ModelServer(engine, chat_format_for(engine, ctx), ctx, sessions, state,
                       gate if gate is not None else ComputeGate(), Metrics(),
                       completion_slots=completion_slots, queue_size=queue_size,
                       chunk_target_s=target_s, clock=compute.clock,
                       speculative="draft" if draft is not None else "off", draft=draft,
                       cost_aware=draft is None)  # fmt: skip


def fake_draft(real: Engine, compute: FakeCompute, ctx: int = 8192) -> DraftModel:
    """The real DraftModel (ds4d.serving.draft) over a second engine on the same fake
    compute: its passes cost engine time on the same clock and are recorded with the
    target's (each under its draft session's state); its logits are the fake's, so every
    draft is the target's own next tokens. Not to be closed (its engine's pool is
    `real`'s)."""
    return DraftModel(fake_engine(real, compute), ctx)


def prompt(n: int, start: int, compute: FakeCompute) -> list[int]:
    """n ordinary tokens, distinct for each `start` (a conversation of its own)."""
    words = compute.text_tokens
    return [words[(start + i * (start + 1)) % len(words)] for i in range(n)]


def request(ids: list[int], max_tokens: int, priority: Priority = "chat",
            key: str | None = None) -> ChatRequest:  # fmt: skip
    return ChatRequest(messages=[], prompt_ids=ids, raw_prompt="", max_tokens=max_tokens,
                       priority=priority, supersede_key=key,
                       sampling=Sampling(temperature=0))  # fmt: skip


@dataclass
class Reading:
    """A request's events, each with the engine time it was handed out at."""

    events: list[tuple[float, Event]] = field(default_factory=list)
    submitted_at: float = 0.0
    slot: int | None = None
    channel: list[trio.MemoryReceiveChannel[Event]] = field(default_factory=list)

    @property
    def text(self) -> str:
        return "".join(e.text for _, e in self.events if isinstance(e, TextDelta))

    @property
    def first_token_at(self) -> float | None:
        return next((t for t, e in self.events if isinstance(e, TextDelta)), None)

    @property
    def finish(self) -> Finish | None:
        return next((e for _, e in self.events if isinstance(e, Finish)), None)

    def tokens(self) -> int:
        return sum(isinstance(e, TextDelta) for _, e in self.events)


async def read(server: ModelServer, req: ChatRequest, compute: FakeCompute, into: Reading,
               stop_after: int | None = None) -> None:  # fmt: skip
    """Run `req`, keeping its events in `into`; leave (cancel it) after `stop_after` tokens."""
    prepared = await server.prepare(req, "completions", "prompt")
    await read_prepared(server, prepared, compute, into, stop_after)


async def read_prepared(server: ModelServer, prepared: Prepared, compute: FakeCompute,
                        into: Reading, stop_after: int | None = None) -> None:  # fmt: skip
    """`read` of a request already prepared: it is submitted before this task's first
    checkpoint, so requests started together in one nursery reach the loop together."""
    into.submitted_at = compute.clock.now
    async with server.generate(prepared) as events:
        async for ev in events:
            into.events.append((compute.clock.now, ev))
            into.slot = prepared.record.slot
            if stop_after is not None and into.tokens() >= stop_after:
                return


async def read_events(events: trio.MemoryReceiveChannel[Event], compute: FakeCompute,
                      into: Reading) -> None:  # fmt: skip
    """Read a request submitted with `server.loop.submit` to its end."""
    async with events:
        async for ev in events:
            into.events.append((compute.clock.now, ev))


def submit_at_pass(server: ModelServer, compute: FakeCompute, when: int | Callable[[Pass], bool],
                   prepared: Prepared, into: Reading) -> trio.Event:  # fmt: skip
    """Submit `prepared` from inside the engine's pass `when` (its number, or the first pass
    it holds for), so while it computes: the loop cannot have moved on, however long the
    test's own task or a worker thread takes to be scheduled. The returned event is set
    once it is submitted, and its channel is `into.channel[0]`."""
    token = trio.lowlevel.current_trio_token()
    submitted = trio.Event()
    into.channel = []
    due = when if callable(when) else lambda p: len(compute.passes) == when

    def submit() -> None:
        into.submitted_at = compute.clock.now
        into.channel.append(server.loop.submit(prepared)[1])
        submitted.set()

    def on_pass(p: Pass) -> None:
        if not into.channel and due(p):
            trio.from_thread.run_sync(submit, trio_token=token)

    compute.on_pass = on_pass
    return submitted


async def with_server(server: ModelServer, body: object) -> None:
    """Run the server's loop while `body()` runs, then stop it."""
    async with trio.open_nursery() as nursery:
        await nursery.start(server.run)
        await body()  # type: ignore[operator]
        nursery.cancel_scope.cancel()


async def until(ready: Callable[[], bool]) -> None:
    """Until `ready()`, in the virtual time of the test's MockClock (autojump): no wall
    time passes. A poll, not an event, because what it waits for may be finished by a
    worker thread (a matching plan, a step), which no clock or trio event reports to the
    test; each round lets those threads and the loop run."""
    # virtual time only: a test that calls this without a MockClock would wait on the wall
    assert isinstance(trio.lowlevel.current_clock(), MockClock), "until() needs a MockClock"
    while not ready():
        await trio.sleep(0.001)  # virtual time (the MockClock jumps)
