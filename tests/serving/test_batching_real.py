"""Continuous batching on the real embedded model: requests decoding at once advance in
one engine call per step and each produces exactly what it produces alone (greedy, and
seeded sampling: a seeded sampler keeps its own draws)."""

from __future__ import annotations

import trio
from trio.testing import MockClock

from ds4d.chat.formats import chat_format_for
from ds4d.chat.types import ChatRequest, Finish, Sampling, TextDelta
from ds4d.daemon.metrics import Metrics
from ds4d.serving.gate import ComputeGate
from ds4d.serving.model import ModelServer
from ds4d.state.service import StateService
from ds4d.state.slots import Slot

TEXTS = ["The capital of France is", "Once upon a time", "def fibonacci(n):"]
SAMPLINGS = [Sampling(temperature=0), Sampling(temperature=0.9, top_k=40, seed=7),
             Sampling(temperature=0)]  # fmt: skip


def test_requests_decode_together_and_each_as_it_would_alone(engine):
    ctx = 256
    metrics = Metrics()
    state = StateService.create(tokenizer=engine.tokenizer, fingerprint="t", ctx=ctx, kv_dir=None)
    slots = [Slot(i, engine.new_session(ctx), ctx) for i in range(3)]
    server = ModelServer(engine, chat_format_for(engine, ctx), ctx, slots, state,
                         ComputeGate(), metrics)  # fmt: skip

    def request(i: int) -> ChatRequest:
        ids = engine.tokenizer.encode(TEXTS[i])
        return ChatRequest(messages=[], prompt_ids=ids, raw_prompt=TEXTS[i], max_tokens=12,
                           sampling=SAMPLINGS[i])  # fmt: skip

    async def one(i: int, out: dict[int, tuple[str, Finish | None]]) -> None:
        prepared = await server.prepare(request(i), "completions", "prompt")
        text, finish = "", None
        async with server.generate(prepared) as events:
            async for ev in events:
                text += ev.text if isinstance(ev, TextDelta) else ""
                finish = ev if isinstance(ev, Finish) else finish
        out[i] = (text, finish)

    together: dict[int, tuple[str, Finish | None]] = {}
    alone: dict[int, tuple[str, Finish | None]] = {}

    async def main() -> None:
        async with trio.open_nursery() as nursery:
            await nursery.start(server.run)
            async with trio.open_nursery() as requests:
                for i in range(3):
                    requests.start_soon(one, i, together)
            steps = metrics.decode_steps, metrics.decode_step_slots
            for i in range(3):
                for slot in slots:
                    slot.session.rewind(0)  # no reuse: each prompt prefilled again
                await one(i, alone)
            together_steps.extend(steps)
            nursery.cancel_scope.cancel()

    together_steps: list[int] = []
    trio.run(main, clock=MockClock(autojump_threshold=0.001))
    assert together == alone
    assert all(f == Finish("length") for _, f in together.values())
    steps, slot_steps = together_steps
    # 13 steps each (12 tokens, then the last one evaluated): all three in nearly all
    assert slot_steps == 3 * 13 and steps <= 13 + 4
