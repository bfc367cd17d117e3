"""The engine loop (ds4d.serving.loop) on a fake of the compute behind the engine seam
(tests/serving/fake_engine.py: real Engine and Sessions, real tokenizer and chat format,
forward passes that cost engine time on a clock of their own). Every run is on trio's
MockClock (autojump); times are engine seconds on the fake's clock, so every bound is
exact whatever the machine's speed and load.

The guarantees: a completion-priority request arriving during a long prefill gets its
first token within one chunk budget, and its chunks go before other prefills; a short chat
prompt's first token comes right after its one chunk, before the long prefill goes on; a
request whose draft model catches up with its prompt takes its turn in the round robin; a
cancellation takes effect at the next step; a newer request with the same supersede key
cancels the older one; completion and chat slots never evict each other; decoding
requests advance in one batch per step, in bursts between another's prefill chunks, and
the prefill is never starved; a failing pass fails only its own request; a step rests
once for its work, and a lone request cancelled mid-rest frees the engine at once; two
models' loops on one gate never compute at once."""

from __future__ import annotations

import dataclasses
from collections.abc import Awaitable, Callable

import pytest
import trio
from trio.testing import MockClock, wait_all_tasks_blocked

from ds4d.chat.errors import Overloaded
from ds4d.chat.types import Finish, Sampling
from ds4d.daemon.power import PowerGovernor
from ds4d.serving.chunking import TARGET_S
from ds4d.serving.gate import ComputeGate
from ds4d.serving.speculation import FOLLOW_TOKENS
from tests.serving.fake_engine import FakeClock, FakeCompute, Pass, text_tokens
from tests.serving.loop_harness import (
    Reading,
    fake_draft,
    make_server,
    prompt,
    read,
    read_events,
    read_prepared,
    request,
    submit_at_pass,
    until,
    with_server,
)


def run_virtual(fn: Callable[[], Awaitable[object]]) -> object:
    return trio.run(fn, clock=MockClock(autojump_threshold=0))


@pytest.fixture
def compute(engine) -> FakeCompute:
    return FakeCompute(FakeClock(), text_tokens(engine))


def _prefill_passes(compute: FakeCompute, state: int) -> list[Pass]:
    return [p for p in compute.passes if state in p.states and max(p.tokens) > 1]


def _state_of(server, slot: int | None) -> int:
    assert slot is not None
    return id(server.pool.slots[slot].session._state)


@pytest.mark.parametrize("priority", ["completion", "chat"])
def test_a_request_arriving_during_a_6000_token_prefill_gets_its_first_token_within_one_chunk(
    engine, compute, priority
):
    """A completion goes first by its priority; a chat prompt of one chunk by the round
    robin's rule that a request whose prompt is in goes first: its first token comes in the
    step after its chunk, before the long prompt's next chunk, not a turn later."""
    server = make_server(engine, compute, slots=2)
    long, quick = Reading(), Reading()
    own_prefill = 24

    async def body() -> None:
        # prepared first and submitted from inside the long prefill's chunk 3000 tokens in:
        # submitting from the test's task once that chunk was seen let the loop run on
        # while the task waited for its turn (on a loaded machine, to the prompt's end)
        ids = prompt(own_prefill, 2, compute)
        prepared = await server.prepare(request(ids, 4, priority), "completions", "prompt")
        deep = submit_at_pass(server, compute, lambda p: p.start >= 3000 * compute.prefill_s,
                              prepared, quick)  # fmt: skip
        async with trio.open_nursery() as nursery:
            nursery.start_soon(read, server, request(prompt(6000, 1, compute), 4), compute, long)
            await deep.wait()
            await read_events(quick.channel[0], compute, quick)
            nursery.cancel_scope.cancel()

    run_virtual(lambda: with_server(server, body))
    first = quick.first_token_at
    assert first is not None and quick.finish == Finish("length")
    # it arrived as the chunk in flight ended: its own prefill, then one decode step, and no
    # chunk of the long prompt between them
    bound = own_prefill * compute.prefill_s + compute.decode_s
    assert first - quick.submitted_at <= bound + 1e-9, (first - quick.submitted_at, bound)
    assert long.first_token_at is None  # the long prompt was still being prefilled
    long_chunks = [p for p in compute.passes if sum(p.tokens) > own_prefill]
    assert all(p.end - p.start <= TARGET_S + 1e-9 for p in long_chunks)  # one budget each
    assert not [p for p in long_chunks if quick.submitted_at < p.end <= first]


def test_a_draft_models_catch_up_chunks_take_turns_with_another_prompts_chunks(engine, compute):
    """Two chat prompts, A (1000 tokens, speculating with a draft model) and B (3000, not
    speculating), submitted together, A first. When A's prompt is in, its draft session
    lacks all of it and takes it as catch-up chunks (prefill work: ds4d.serving.draft)
    before A decodes. Those chunks are chunks: A takes its turn in the round robin
    (`Work.prompt_in` is false while its draft catches up), it does not go before B's
    every chunk until its draft has caught up. The order of the prefill calls while B has
    chunks left (A: A's prompt chunk, B: B's, D: a catch-up chunk of A's draft session):
    A and B alternate, A's prompt chunks then its catch-up chunks, except at the switch,
    where A's first catch-up chunk follows its last prompt chunk directly (that step's
    plan picked A as a request whose prompt is in, before its catch-up was known):
    ABAB...A DBDB...D, then B's remaining chunks."""
    draft = fake_draft(engine, compute)
    server = make_server(engine, compute, slots=2, draft=draft)
    readings = {"A": Reading(), "B": Reading()}
    drafted: dict[str, int] = {}

    async def body() -> None:
        a = request(prompt(1000, 1, compute), 8)
        b = request(prompt(3000, 2, compute), 2)
        b = dataclasses.replace(b, sampling=Sampling(temperature=0, speculative=False))
        prepared = {"A": await server.prepare(a, "completions", "prompt"),
                    "B": await server.prepare(b, "completions", "prompt")}  # fmt: skip
        async with trio.open_nursery() as nursery:
            for name in ("A", "B"):  # from one task: A is submitted first
                readings[name].submitted_at = compute.clock.now
                events = server.loop.submit(prepared[name])[1]
                nursery.start_soon(read_events, events, compute, readings[name])
        for name in ("A", "B"):
            readings[name].slot = prepared[name].record.slot
            drafted[name] = prepared[name].record.drafted_tokens

    run_virtual(lambda: with_server(server, body))
    assert [readings[n].finish for n in ("A", "B")] == [Finish("length")] * 2
    assert drafted["A"] > 0 and drafted["B"] == 0  # A's draft model drafted once caught up
    slots = {_state_of(server, readings[n].slot): n for n in ("A", "B")}
    # The prefill calls in order: a prompt chunk of A or B (its session's pass of more than
    # one token), or a catch-up chunk of A's draft session (a pass of a session that is no
    # slot's, of more tokens than a drafting step's own catching up evaluates). After the
    # last catch-up chunk, A's passes of more than one token are its verification chunks.
    calls = ""
    for p in compute.passes:
        for state, n in zip(p.states, p.tokens, strict=True):
            if state in slots and n > 1:
                calls += slots[state]
            elif state not in slots and n > FOLLOW_TOKENS:
                calls += "D"
    last = calls.rindex("D")
    n_prompt, n_catch_up = calls[:last].count("A"), calls.count("D")
    assert n_catch_up >= 3, calls  # the draft catches up over several chunks
    assert "B" in calls[last + 1 :], calls  # B still had chunks when the catch-up ended
    expected = "AB" * (n_prompt - 1) + "A" + "DB" * (n_catch_up - 1) + "D"
    assert calls[: last + 1] == expected, calls


def test_a_completions_chunks_go_before_other_prefills(engine, compute):
    """Two chat prefills take turns chunk by chunk; a completion's prompt of three chunks
    arriving meanwhile is prefilled in three consecutive steps."""
    server = make_server(engine, compute, slots=3)
    readings = [Reading(), Reading(), Reading()]

    async def body() -> None:
        req = request(prompt(3 * 250 - 10, 30, compute), 2, "completion")
        prepared = await server.prepare(req, "completions", "prompt")
        submitted = submit_at_pass(server, compute, 6, prepared, readings[2])
        async with trio.open_nursery() as nursery:
            for i in range(2):
                req = request(prompt(3000, 10 + i, compute), 2)
                nursery.start_soon(read, server, req, compute, readings[i])
            await submitted.wait()
            await read_events(readings[2].channel[0], compute, readings[2])
            readings[2].slot = prepared.record.slot
            nursery.cancel_scope.cancel()

    run_virtual(lambda: with_server(server, body))
    assert readings[2].finish == Finish("length")
    chunks = [p for p in compute.passes if max(p.tokens) > 1]
    mine = _state_of(server, readings[2].slot)
    at = [i for i, p in enumerate(chunks) if mine in p.states]
    assert len(at) == 3 and at == list(range(at[0], at[0] + 3)), at
    others = [i for i, p in enumerate(chunks) if mine not in p.states]
    assert others[-1] > at[-1]  # the chat prefills were still running


def test_a_cancellation_takes_effect_at_the_next_step(engine, compute):
    server = make_server(engine, compute, slots=2)
    gone, stays = Reading(), Reading()
    seen: dict[str, int] = {}

    async def body() -> None:
        async with trio.open_nursery() as nursery:
            nursery.start_soon(read, server, request(prompt(40, 1, compute), 200), compute, stays)
            await read(server, request(prompt(40, 2, compute), 200), compute, gone, stop_after=5)
            seen["passes"] = len(compute.passes)  # the client has gone away

    run_virtual(lambda: with_server(server, body))
    state = _state_of(server, gone.slot)
    later = [p for p in compute.passes[seen["passes"] :] if state in p.states]
    assert len(later) <= 1  # at most the step that was being computed
    assert stays.finish == Finish("length") and stays.tokens() > 50
    assert gone.finish is None
    assert not server.pool.slots[gone.slot].busy


def test_a_newer_request_with_the_same_key_cancels_the_older_one(engine, compute):
    server = make_server(engine, compute, slots=2)
    older, newer = Reading(), Reading()

    async def body() -> None:
        req = request(prompt(20, 2, compute), 8, "completion", key="editor:main.py")
        prepared = await server.prepare(req, "completions", "prompt")
        submitted = submit_at_pass(server, compute, 3, prepared, newer)  # older prefilling
        req = request(prompt(3000, 1, compute), 8, "completion", key="editor:main.py")
        async with trio.open_nursery() as nursery:
            nursery.start_soon(read, server, req, compute, older)
            await submitted.wait()
            await read_events(newer.channel[0], compute, newer)

    run_virtual(lambda: with_server(server, body))
    assert older.finish == Finish("error", "superseded by a newer request")
    assert newer.finish == Finish("length") and newer.tokens() > 0
    state = _state_of(server, older.slot)
    # only the chunk in flight when the newer one came
    assert len([p for p in compute.passes if state in p.states and p.end > newer.submitted_at]) <= 1
    assert len(compute.passes) < 3 + 12  # the older prompt's 12 chunks were not all run
    assert server.busy == 0


def test_completion_and_chat_slots_do_not_evict_each_other(engine, compute):
    server = make_server(engine, compute, slots=3, completion_slots=1)
    held: dict[str, list[list[int]]] = {}

    def tokens() -> list[list[int]]:
        return [list(s.session.tokens) for s in server.pool.slots]

    async def body() -> None:
        readings = [Reading() for _ in range(6)]
        async with trio.open_nursery() as nursery:  # two agents hold both chat slots...
            for i in range(2):
                # long answers: however the worker threads are scheduled, neither agent
                # can end before the other has its slot; they are cancelled below
                req = request(prompt(300, 1 + i, compute), 4000)
                nursery.start_soon(read, server, req, compute, readings[i])
            await until(lambda: server.busy >= 2)  # both have their slot
            # ...and a completion still starts at once, on its own slot
            await read(server, request(prompt(50, 5, compute), 2, "completion"), compute,
                       readings[2])  # fmt: skip
            assert readings[2].slot == 2 and server.busy == 2
            nursery.cancel_scope.cancel()
        await until(lambda: not server.busy)  # the cancellations take effect at the next step
        held["before"] = tokens()
        # a third conversation takes a chat slot (the least recently used), not slot 2
        await read(server, request(prompt(300, 7, compute), 2), compute, readings[3])
        held["chat"] = tokens()
        # another completion replaces the first one's KV, not a chat slot's
        await read(server, request(prompt(60, 9, compute), 2, "completion"), compute,
                   readings[4])  # fmt: skip
        held["completion"] = tokens()
        # a completion waits for its slot, not for a chat one; a full queue is refused
        assert readings[3].slot in (0, 1) and readings[4].slot == 2

    run_virtual(lambda: with_server(server, body))
    before, chat, completion = held["before"], held["chat"], held["completion"]
    assert chat[2] == before[2]  # the completion slot kept its KV
    assert sum(chat[i] != before[i] for i in (0, 1)) == 1
    assert completion[:2] == chat[:2] and completion[2] != chat[2]


def test_a_full_queue_is_refused_and_a_waiting_request_gets_the_next_free_slot(engine, compute):
    gate = ComputeGate()
    server = make_server(engine, compute, slots=1, queue_size=1, gate=gate)
    readings = [Reading() for _ in range(2)]
    refused: list[BaseException] = []

    async def body() -> None:
        async with trio.open_nursery() as nursery:
            # No step while the queue fills: the first request must not finish (its steps
            # run on worker threads, in no virtual time) before the third is refused.
            async with gate.turn():
                first = request(prompt(40, 1, compute), 300)
                nursery.start_soon(read, server, first, compute, readings[0])
                await until(lambda: server.busy >= 1)  # the first has the slot
                second = request(prompt(40, 2, compute), 300)
                nursery.start_soon(read, server, second, compute, readings[1])
                await until(lambda: server.loop.waiting >= 1)  # the second waits
                try:
                    await read(server, request(prompt(40, 5, compute), 10), compute, Reading())
                except Overloaded as e:
                    refused.append(e)

    run_virtual(lambda: with_server(server, body))
    assert len(refused) == 1
    assert [r.finish for r in readings] == [Finish("length")] * 2
    first, second = sorted(readings, key=lambda r: r.first_token_at or 0.0)
    assert first.events[-1][0] <= (second.first_token_at or 0.0)  # one after the other


def test_decoding_requests_advance_in_one_batch_per_step(engine, compute):
    server = make_server(engine, compute, slots=3)
    readings = [Reading() for _ in range(3)]

    async def body() -> None:
        # Prepared first (on worker threads, in real time), then submitted in one batch of
        # trio's scheduler: the loop takes all three before any plan of theirs is made
        # (a plan's result comes back in a later batch), and picks no prefill while one
        # is planning, so the three start together. (Holding the engine gate until all
        # three were planned deadlocked whenever the first was planned before the others
        # were submitted: the loop then waited on the gate with its inbox unread.)
        reqs = [request(prompt(20, 1 + i, compute), 30) for i in range(3)]
        prepared = [await server.prepare(r, "completions", "prompt") for r in reqs]
        async with trio.open_nursery() as nursery:
            for p, reading in zip(prepared, readings, strict=True):
                nursery.start_soon(read_prepared, server, p, compute, reading)

    run_virtual(lambda: with_server(server, body))
    decodes = [p for p in compute.passes if max(p.tokens) == 1]
    assert sum(len(p.states) == 3 for p in decodes) >= 25  # all three in nearly every step
    alone = _alone(server, request(prompt(20, 2, compute), 30), compute)
    assert readings[1].text == alone.text and readings[1].finish == alone.finish


@pytest.mark.parametrize("decode_s,batches", [(0.02, 12), (0.1, 3)])
def test_decode_steps_and_prefill_chunks_take_turns(engine, compute, decode_s, batches):
    """A 0.25 s chunk earns the decoding requests 0.25 s of steps: twelve at 20 ms, three
    at 100 ms (nearly: the step with the next chunk is one more), then the prefill's
    next chunk. The decoders get bursts, the prefill about half the engine."""
    compute.decode_s = decode_s
    server = make_server(engine, compute, slots=3)
    readings = [Reading() for _ in range(3)]

    async def body() -> None:
        # submitted from inside the first step that decodes both (from the test's task, a
        # late wake-up on a loaded machine would let them decode on alone)
        prepared = await server.prepare(request(prompt(4000, 9, compute), 1), "completions",
                                        "prompt")  # fmt: skip
        both = submit_at_pass(server, compute, lambda p: p.tokens == [1, 1], prepared,
                              readings[2])  # fmt: skip
        async with trio.open_nursery() as nursery:
            for i in range(2):
                req = request(prompt(20, 1 + i, compute), 400)
                nursery.start_soon(read, server, req, compute, readings[i])
            await both.wait()
            await read_events(readings[2].channel[0], compute, readings[2])
            readings[2].slot = prepared.record.slot
            nursery.cancel_scope.cancel()

    run_virtual(lambda: with_server(server, body))
    long = _state_of(server, readings[2].slot)
    passes = compute.passes
    chunks = [i for i, p in enumerate(passes) if long in p.states and max(p.tokens) > 1]
    assert len(chunks) >= 10
    between = [b - a - 1 for a, b in zip(chunks[2:], chunks[3:], strict=False)]
    # each run of decode steps lasts one chunk's time: its credit (the chunk's own step
    # has a decode batch too)
    assert all(batches <= n <= batches + 1 for n in between), between


def test_a_failing_pass_fails_only_its_own_request(engine, compute):
    server = make_server(engine, compute, slots=3)
    readings = [Reading() for _ in range(3)]
    victim = _state_of(server, 1)  # whichever request gets slot 1 fails at its 6th token

    def fail(state, tokens) -> bool:
        return id(state) == victim and state.n_past >= 45

    compute.fail = fail

    async def body() -> None:
        async with trio.open_nursery() as nursery:
            for i in range(3):
                req = request(prompt(40, 1 + i, compute), 20)
                nursery.start_soon(read, server, req, compute, readings[i])

    run_virtual(lambda: with_server(server, body))
    (failed,) = [i for i in range(3) if readings[i].slot == 1]
    assert readings[failed].finish == Finish(
        "error", "generation failed (details are in the server log)"
    )
    assert readings[failed].tokens() >= 4
    for i in {0, 1, 2} - {failed}:
        assert readings[i].finish == Finish("length")
        alone = _alone(server, request(prompt(40, 1 + i, compute), 20), compute)
        assert readings[i].text == alone.text


def _alone(server, req, compute: FakeCompute) -> Reading:
    """What the request produces with the loop to itself."""
    out = Reading()
    run_virtual(lambda: with_server(server, lambda: read(server, req, compute, out)))
    return out


def test_a_step_rests_once_for_its_work_and_a_lone_cancelled_request_stops_the_rest(
    engine, compute
):
    governor = PowerGovernor(50)  # rest = work
    rests: list[float] = []

    async def pace(work: float) -> None:
        rests.append(work)
        await governor.rest(work)

    server = make_server(engine, compute, slots=1, gate=ComputeGate(pace))
    done = Reading()

    async def body() -> None:
        await read(server, request(prompt(20, 1, compute), 5), compute, done)

    run_virtual(lambda: with_server(server, body))
    # one rest per step, for that step's work: the prefill, a step that only sampled
    # (the prefill left its logits), then a pass each
    work = [p.end - p.start for p in compute.passes]
    assert rests == pytest.approx([work[0], 0.0, *work[1:]])

    governor.set_level(1)  # each 20 ms step owes about 2 s of rest
    ended: dict[str, float] = {}

    async def cancelled() -> None:
        with trio.move_on_after(0.5):
            await read(server, request(prompt(20, 2, compute), 50), compute, Reading())
        ended["cancelled"] = trio.current_time()
        governor.set_level(100)
        await read(server, request(prompt(20, 3, compute), 1), compute, Reading())
        ended["next"] = trio.current_time()

    run_virtual(lambda: with_server(server, cancelled))
    assert ended["next"] - ended["cancelled"] < 0.1  # not the 2 s the last step owed


def test_two_models_loops_on_one_gate_never_compute_at_once(engine):
    import threading

    gate = ComputeGate()
    computes = [FakeCompute(FakeClock(), text_tokens(engine)) for _ in range(2)]
    hold = threading.Event()
    running = {"peak": 0, "now": 0}
    lock = threading.Lock()

    def on_pass(p: Pass) -> None:
        with lock:
            running["now"] += 1
            running["peak"] = max(running["peak"], running["now"])
        if not hold.is_set():
            hold.wait(30)  # the first pass is held until the other loop has had its chance
        with lock:
            running["now"] -= 1

    for c in computes:
        c.on_pass = on_pass
    servers = [make_server(engine, c, slots=1, gate=gate) for c in computes]

    async def main() -> None:
        async with trio.open_nursery() as nursery:
            for s in servers:
                await nursery.start(s.run)
            async with trio.open_nursery() as requests:
                for i, (s, c) in enumerate(zip(servers, computes, strict=True)):
                    requests.start_soon(read, s, request(prompt(30, i, c), 3), c, Reading())
                await wait_all_tasks_blocked()
                hold.set()
            nursery.cancel_scope.cancel()

    trio.run(main)
    assert running["peak"] == 1
