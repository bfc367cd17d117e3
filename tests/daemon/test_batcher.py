"""The decode batcher on the real embedded model: members advance together (one engine call
per step) and produce exactly what each produces alone; they join and leave between
steps; a cancelled or failing member leaves without disturbing the others; prefill chunks
and decode batches take turns through the engine gate's credit; a batch rests once, for
its work, and a lone member that is cancelled stops that rest.

Every run is on trio's MockClock (autojump); where the gate's work must be exact, its
clock counts the tokens the sessions hold instead of reading the time."""

from __future__ import annotations

import functools
from collections.abc import Callable

import pytest
import trio
from trio.testing import MockClock

from ds4d.daemon.batcher import Batcher, Member
from ds4d.daemon.power import PowerGovernor
from ds4d.daemon.scheduler import EngineGate
from ds4d.engine.errors import EngineError
from ds4d.engine.sampler import SamplingParams, make_rng, sample

GREEDY = SamplingParams(temperature=0)
SAMPLED = SamplingParams(temperature=0.9, top_k=40, seed=7)
TEXTS = ["The capital of France is", "Once upon a time", "def fibonacci(n):",
         "The three primary colors are"]  # fmt: skip


def run_virtual(fn: Callable[[], object]) -> object:
    # The clock jumps once the loop has been idle for a millisecond of real time: with a
    # threshold of 0 the loop polls without blocking all through each engine call on the
    # gate's worker thread, a core spinning beside the engine's own threads.
    return trio.run(fn, clock=MockClock(autojump_threshold=0.001))


@pytest.fixture
def prompts(engine) -> list[list[int]]:
    return [engine.tokenizer.encode(t) for t in TEXTS]


def alone(engine, prompt: list[int], n: int, params: SamplingParams = GREEDY) -> list[int]:
    """n tokens decoded by one session on its own, no batcher, no gate."""
    session = engine.new_session(256)
    session.eval(prompt)
    rng = make_rng(params.seed)
    out = []
    for _ in range(n):
        out.append(sample(session.compute_logits(), params, rng))
        session.eval(out[-1:])
    return out


def _sample(session, params: SamplingParams, rng) -> int:
    return sample(session.compute_logits(), params, rng)


async def decode(member: Member, n: int, out: list[int], params: SamplingParams = GREEDY) -> None:
    """What the daemon's decode loop does with its member: step, handle the token, step."""
    rng = make_rng(params.seed)
    pending: list[int] = []
    for _ in range(n):
        token = await member.step(pending, functools.partial(_sample, member.session, params, rng))
        out.append(token)
        pending = [token]
        await trio.lowlevel.checkpoint()  # handling the token: parsing, emitting it
    await member.step(pending)


def sessions_for(engine, prompts: list[list[int]]) -> list:
    sessions = []
    for p in prompts:
        s = engine.new_session(256)
        s.eval(p)
        sessions.append(s)
    return sessions


def test_members_advance_together_and_each_decodes_what_it_would_alone(engine, prompts):
    n = 8
    sizes: list[int] = []
    sessions = sessions_for(engine, prompts[:3])
    outs: list[list[int]] = [[], [], []]
    params = [GREEDY, SAMPLED, GREEDY]  # a seeded sampler keeps its own draws

    async def main() -> None:
        batcher = Batcher(engine, EngineGate(), on_batch=sizes.append)

        async def one(i: int) -> None:
            with batcher.join(sessions[i]) as member:
                await decode(member, n, outs[i], params[i])

        async with trio.open_nursery() as nursery:
            for i in range(3):
                nursery.start_soon(one, i)
        assert batcher.members == 0

    run_virtual(main)
    assert sizes == [3] * (n + 1)  # one engine call per step, every member in each
    for i in range(3):
        assert outs[i] == alone(engine, prompts[i], n, params[i])
        assert sessions[i].tokens == prompts[i] + outs[i]


def test_members_join_and_leave_between_steps(engine, prompts):
    lengths = [10, 3, 4]
    sizes: list[int] = []
    sessions = sessions_for(engine, prompts[:3])
    outs: list[list[int]] = [[], [], []]

    async def main() -> None:
        batcher = Batcher(engine, EngineGate(), on_batch=sizes.append)
        third_may_join = trio.Event()

        async def one(i: int) -> None:
            if i == 2:
                await third_may_join.wait()
            with batcher.join(sessions[i]) as member:
                await decode(member, lengths[i], outs[i])
            if i == 1:  # the second left after 4 steps: the third joins a running batch
                third_may_join.set()

        async with trio.open_nursery() as nursery:
            for i in range(3):
                nursery.start_soon(one, i)

    run_virtual(main)
    assert sum(sizes) == sum(n + 1 for n in lengths)  # every step computed exactly once
    assert sizes[:4] == [2, 2, 2, 2] and max(sizes) == 2 and sizes[-1] == 1
    for i in range(3):
        assert outs[i] == alone(engine, prompts[i], lengths[i])


def test_a_member_cancelled_while_waiting_leaves_the_others_undisturbed(engine, prompts):
    n = 8
    sessions = sessions_for(engine, prompts[:3])
    outs: list[list[int]] = [[], [], []]

    async def main() -> None:
        batcher = Batcher(engine, EngineGate())

        async def one(i: int) -> None:
            with trio.CancelScope() as scope, batcher.join(sessions[i]) as member:
                pending: list[int] = []
                for _ in range(n):
                    if i == 1 and len(outs[i]) == 3:
                        scope.cancel()  # e.g. its client went away
                    token = await member.step(
                        pending, functools.partial(_sample, sessions[i], GREEDY, make_rng())
                    )
                    outs[i].append(token)
                    pending = [token]
                await member.step(pending)

        async with trio.open_nursery() as nursery:
            for i in range(3):
                nursery.start_soon(one, i)
        assert batcher.members == 0

    run_virtual(main)
    for i in (0, 2):
        assert outs[i] == alone(engine, prompts[i], n)
    assert outs[1] == alone(engine, prompts[1], 3)
    held = sessions[1].tokens  # what it had evaluated when it left: consistent
    assert held[: len(prompts[1])] == prompts[1]
    assert held[len(prompts[1]) :] == outs[1][: len(held) - len(prompts[1])]


def test_a_member_cancelled_mid_computation_leaves_once_its_session_is_done(engine, prompts):
    """The slot it frees must not change under its next owner: the cancellation arrives
    only once the engine has finished with the session."""
    sessions = sessions_for(engine, prompts[:2])
    seen: dict[str, int] = {}

    async def main() -> None:
        batcher = Batcher(engine, EngineGate())
        scope = trio.CancelScope()
        token = trio.lowlevel.current_trio_token()

        def cancel_then_sample(session) -> int:
            trio.from_thread.run_sync(scope.cancel, trio_token=token)  # while in flight
            return _sample(session, GREEDY, make_rng())

        async def victim() -> None:
            with scope, batcher.join(sessions[1]) as member:
                first = await member.step(
                    [], functools.partial(_sample, sessions[1], GREEDY, make_rng())
                )
                try:
                    await member.step([first], functools.partial(cancel_then_sample, sessions[1]))
                finally:
                    seen["at_cancel"] = sessions[1].n_tokens
            seen["cancelled"] = int(scope.cancelled_caught)

        async def other() -> None:
            with batcher.join(sessions[0]) as member:
                await decode(member, 6, [])

        async with trio.open_nursery() as nursery:
            nursery.start_soon(victim)
            nursery.start_soon(other)

    run_virtual(main)
    assert seen == {"at_cancel": len(prompts[1]) + 1, "cancelled": 1}
    assert sessions[1].n_tokens == len(prompts[1]) + 1


def test_a_failing_step_fails_only_its_member(engine, prompts):
    n = 6
    sessions = sessions_for(engine, prompts[:4])
    outs: list[list[int]] = [[], [], [], []]
    errors: dict[int, BaseException] = {}

    def failing_sample(session) -> int:
        raise ValueError("sampling failed")

    async def main() -> None:
        batcher = Batcher(engine, EngineGate())

        async def one(i: int) -> None:
            try:
                with batcher.join(sessions[i]) as member:
                    pending: list[int] = []
                    for k in range(n):
                        after = functools.partial(_sample, sessions[i], GREEDY, make_rng())
                        if i == 1 and k == 3:  # its own after-work fails
                            after = functools.partial(failing_sample, sessions[i])
                        if i == 2 and k == 3:  # its token cannot be evaluated
                            pending = [engine.info.n_vocab + 5]
                        token = await member.step(pending, after)
                        outs[i].append(token)
                        pending = [token]
                    await member.step(pending)
            except Exception as e:
                errors[i] = e

        async with trio.open_nursery() as nursery:
            for i in range(4):
                nursery.start_soon(one, i)

    run_virtual(main)
    assert sorted(errors) == [1, 2]
    assert isinstance(errors[1], ValueError) and isinstance(errors[2], EngineError)
    for i in (0, 3):
        assert outs[i] == alone(engine, prompts[i], n)
        assert sessions[i].tokens == prompts[i] + outs[i]
    assert sessions[2].tokens == prompts[2] + outs[2][:2]  # the bad token never went in


def _token_clock(sessions, weights) -> Callable[[], float]:
    """Work measured in tokens evaluated (each session's tokens times its weight): the
    gate's credit arithmetic is then exact, whatever the machine's speed."""
    return lambda: float(sum(s.n_tokens * w for s, w in zip(sessions, weights, strict=True)))


@pytest.mark.parametrize("decode_weight,steps", [(1, 12), (8, 20)])
def test_decode_batches_and_prefill_chunks_take_turns(engine, prompts, decode_weight, steps):
    """A 64-token chunk earns the decode batches 64 units of engine time: with batches of
    2 tokens at 1 unit each, 12 steps fit in one chunk's credit and the decoders finish
    before the second chunk; at 8 units a token (16 per batch) the chunks get their turn
    every 4 batches, so the prefill is never starved."""
    chunk = 64  # the gate's arithmetic does not depend on the size: kept small, for speed
    prefill = engine.new_session(4 * chunk + 8)
    decoders = sessions_for(engine, prompts[:2])
    log: list[str] = []
    text = engine.tokenizer.encode("word " * 300)[: 4 * chunk]

    async def main() -> None:
        gate = EngineGate(
            clock=_token_clock([prefill, *decoders], [1, decode_weight, decode_weight])
        )
        batcher = Batcher(engine, gate, on_batch=lambda size: log.append(f"b{size}"))
        started = trio.Event()

        async def prefill_task() -> None:
            for k in range(4):
                if k == 0:
                    started.set()  # the decoders queue behind the first chunk
                await gate.run(prefill.eval, text[k * chunk : (k + 1) * chunk], bulk=True)
                log.append("C")

        async def decoder(i: int) -> None:
            await started.wait()
            with batcher.join(decoders[i]) as member:
                await decode(member, steps, [])
            log.append(f"done{i}")

        async with trio.open_nursery() as nursery:
            nursery.start_soon(prefill_task)
            for i in range(2):
                nursery.start_soon(decoder, i)

    run_virtual(main)
    chunks = [i for i, e in enumerate(log) if e == "C"]
    assert len(chunks) == 4
    runs = [
        sum(e.startswith("b") for e in log[a + 1 : b])
        for a, b in zip(chunks, chunks[1:], strict=False)
    ]
    if decode_weight == 1:
        # every step of both decoders between the first two chunks, in batches of 2
        assert log[: chunks[1]].count("b2") == steps + 1 and runs[1:] == [0, 0]
        assert {"done0", "done1"} <= set(log[: chunks[1]])
    else:
        # 64 units of credit per chunk / 16 per batch: 4 batches (the first step of each
        # decoder evaluates nothing, so costs nothing), then the next chunk
        assert runs[0] == 5 and runs[1:] == [4, 4]
        assert "done0" not in log[: chunks[-1]]  # the prefill finished first


def test_a_batch_rests_once_for_its_work(engine, prompts):
    n = 4
    sessions = sessions_for(engine, prompts[:2])
    governor = PowerGovernor(50)  # rest = work
    rests: list[float] = []

    async def pace(work: float) -> None:
        rests.append(work)
        await governor.rest(work)

    async def main() -> float:
        gate = EngineGate(pace, clock=_token_clock(sessions, [0.01, 0.01]))
        batcher = Batcher(engine, gate)
        start = trio.current_time()

        async def one(i: int) -> None:
            with batcher.join(sessions[i]) as member:
                await decode(member, n, [])

        async with trio.open_nursery() as nursery:
            for i in range(2):
                nursery.start_soon(one, i)
        await gate.run(str, "the engine, once the last batch has rested")
        return trio.current_time() - start

    elapsed = run_virtual(main)
    # the first step evaluates nothing; each later one, a token per member
    assert rests[:-1] == pytest.approx([0.0] + [0.02] * n)
    assert elapsed == pytest.approx(0.02 * n)


def test_a_lone_member_cancelled_mid_rest_frees_the_engine_at_once(engine, prompts):
    session = sessions_for(engine, prompts[:1])[0]
    governor = PowerGovernor(1)  # each token owes 99 x 0.05 s of rest

    async def main() -> tuple[float, str]:
        gate = EngineGate(governor.rest, clock=_token_clock([session], [0.05]))
        batcher = Batcher(engine, gate)
        with trio.move_on_after(0.2), batcher.join(session) as member:
            await decode(member, 4, [])
        cancelled_after = trio.current_time()
        return cancelled_after, await gate.run(str, "engine free")

    cancelled_after, result = run_virtual(main)
    assert result == "engine free" and cancelled_after == pytest.approx(0.2)
