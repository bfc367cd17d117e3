"""A slot's recent completion states (ds4d.state.recent) through the one KV sync, on a real
engine session: keystroke sequences where every prompt evaluates exactly the tokens from
its first difference with the closest state seen before (none for a state seen before),
and a restored state is bitwise the state first computed."""

from __future__ import annotations

import numpy as np

from ds4d.state.matching import common_prefix
from ds4d.state.recent import RecentStates
from ds4d.state.sync import EvalChunk, KVCalls, SlotSync, plan_with_recent, run_call

FILE = [(7 * i) % 900 + 20 for i in range(600)]  # the file up to the cursor's line
LINE = [1000 + i for i in range(12)]  # the cursor's line, typed a token at a time
SUFFIX = [(11 * i) % 700 + 30 for i in range(40)]  # the file after the cursor


def typed(k: int) -> list[int]:
    return FILE + LINE[:k] + SUFFIX


def up(k: int, lines: int = 50) -> list[int]:
    """The cursor `lines` tokens above the typed line."""
    return FILE[:-lines] + SUFFIX[:3] + FILE[-lines:] + LINE[:k] + SUFFIX


def sync(session, recent, prompt) -> int:
    """Brings the session to `prompt` as the engine loop does for a completion; returns the
    tokens evaluated (and checks the session holds the prompt with its logits)."""
    plan, route = plan_with_recent(None, session, "", prompt, recent, 1)
    s = SlotSync(session, "", prompt, plan, None, (), recent, route)
    calls, evaluated = KVCalls(None), 0
    while (call := s.next()) is not None:
        if isinstance(call, EvalChunk):
            evaluated += len(call.tokens)
        s.took(call, run_call(calls, session, call))
    assert list(session.tokens) == prompt and session.last_logits is not None
    assert s.result().cached_tokens == len(prompt) - evaluated
    return evaluated


def minimum(seen: list[list[int]], prompt: list[int]) -> int:
    """The fewest tokens an exact server can evaluate: none for a state it holds, else the
    tokens from the first that differs from the closest one (at least one: logits)."""
    if prompt in seen:
        return 0
    shared = max((common_prefix(s, prompt) for s in seen), default=0)
    return len(prompt) - min(shared, len(prompt) - 1)


def replay(engine, prompts, budget=256 << 20):
    session = engine.new_session(1024)
    recent = RecentStates(budget)
    seen: list[list[int]] = []
    costs = []
    for p in prompts:
        costs.append((sync(session, recent, p), minimum(seen, p)))
        seen.append(p)
    return session, recent, costs


KEYSTROKES = (
    [typed(k) for k in range(0, 7)]
    + [typed(5), typed(6), typed(5), typed(4), typed(5), typed(6), typed(7)]  # backspaces, undo
    + [up(7), typed(7), typed(8), up(8), typed(8), typed(3)]  # the cursor up and back
)


def keystroke_bytes(engine) -> tuple[int, int]:
    """The bytes of the cold state and of a keystroke's state (the rows it evaluated)."""
    session = engine.new_session(1024)
    probe = RecentStates(1 << 30)
    sync(session, probe, typed(0))
    cold = probe.nbytes
    sync(session, probe, typed(1))
    return cold, probe.nbytes - cold


def test_every_keystroke_evaluates_the_minimum_and_a_state_seen_before_nothing(engine):
    _, recent, costs = replay(engine, KEYSTROKES)
    assert [c for c, _ in costs] == [m for _, m in costs]
    returns = [i for i, p in enumerate(KEYSTROKES) if p in KEYSTROKES[:i]]
    assert len(returns) == 9 and all(costs[i] == (0, 0) for i in returns)
    assert 0 < recent.nbytes <= 256 << 20


def test_the_cursor_moving_back_finds_the_rows_it_left(engine):
    """With no room for the cold state, the rows the live session drops when the cursor
    moves up are kept as a bridge: coming back down evaluates only what is new."""
    cold, size = keystroke_bytes(engine)
    budget = 24 * size
    assert cold > budget // 4  # the cold state is not kept
    _, recent, costs = replay(engine, KEYSTROKES, budget)
    assert [c for c, _ in costs] == [m for _, m in costs]
    assert recent.nbytes <= budget


def test_without_recent_states_a_return_is_evaluated_again(engine):
    """The check above can fail: the live session alone re-reads every state left."""
    session = engine.new_session(1024)
    for p in KEYSTROKES[:7]:
        sync(session, None, p)
    assert sync(session, None, typed(5)) == len(SUFFIX)


def test_a_restored_state_is_bitwise_the_state_first_computed(engine):
    session = engine.new_session(1024)
    recent = RecentStates(256 << 20)
    sync(session, recent, typed(4))
    first = session.last_logits.copy()
    sync(session, recent, typed(5))
    sync(session, recent, up(5))
    assert sync(session, recent, typed(4)) == 0
    assert np.array_equal(session.last_logits, first)
    # and it goes on exactly as a fresh evaluation of the same prompt does
    fresh = engine.new_session(1024)
    fresh.eval(typed(4))
    assert np.array_equal(session.last_logits, fresh.last_logits)
    for _ in range(4):
        a, b = int(np.argmax(session.compute_logits())), int(np.argmax(fresh.compute_logits()))
        assert a == b
        session.eval([a])
        fresh.eval([b])
    assert list(session.tokens) == list(fresh.tokens)


def test_the_budget_bounds_the_bytes_and_drops_the_oldest(engine):
    cold, size = keystroke_bytes(engine)
    assert 0 < size < cold
    budget = 4 * size + size // 2  # room for four such states (the cold one is too big)
    _, recent, costs = replay(engine, [typed(k) for k in range(8)] + [typed(6), typed(2)],
                              budget)  # fmt: skip
    assert recent.nbytes <= budget and len(recent) == 4
    assert costs[-2] == (0, 0)  # recent enough: kept
    assert costs[-1] == (len(SUFFIX), 0)  # dropped for room: evaluated again
    none = RecentStates(0)
    session = engine.new_session(1024)
    sync(session, none, typed(1))
    sync(session, none, typed(2))
    assert none.nbytes == 0 and len(none) == 0


def test_the_same_prompt_after_a_generation_costs_nothing_even_when_too_long_to_keep(engine):
    """Another candidate (n_cmpl) or a repeated request: the session holds the prompt and
    what was generated after it; of a state too long to keep whole, its last token is
    kept, so the prompt comes back with its exact logits and nothing evaluated."""
    cold, size = keystroke_bytes(engine)
    session = engine.new_session(1024)
    recent = RecentStates(2 * size)  # far too small for the cold state
    assert sync(session, recent, typed(3)) == len(typed(3))
    first = session.last_logits.copy()
    session.eval([int(np.argmax(first)), 5, 6])  # generated
    assert sync(session, recent, typed(3)) == 0
    assert np.array_equal(session.last_logits, first)
    without = engine.new_session(1024)
    sync(without, None, typed(3))
    without.eval([7, 8])
    assert sync(without, None, typed(3)) == 1
