"""The KV state under steering, with the real engine: the disk cache holds the checkpoints
of one steering (the daemon's at start); a session steered otherwise neither restores
from it nor writes to it, and a slot changing steering drops its KV (saved first when the
cache holds the steering it was computed under)."""

from __future__ import annotations

import numpy as np
import pytest

from ds4d.engine.steering import Steering
from ds4d.state.diskcache import DiskCache
from ds4d.state.kvstate import KVState
from ds4d.state.recent import RecentStates
from ds4d.state.savepolicy import SavePolicy
from ds4d.state.sync import steer_session, sync_session
from tests.state.test_kvstate import CTX, TALK_A, TALK_B


@pytest.fixture(scope="module")
def steering(engine) -> Steering:
    rng = np.random.default_rng(0)
    dirs = np.zeros((engine.info.n_layer, engine.info.n_embd), np.float32)
    dirs[4:13] = rng.standard_normal((9, engine.info.n_embd))
    return Steering(4.0 * dirs / np.linalg.norm(dirs, axis=1, keepdims=True).clip(1e-9))


def make(engine, directory, steering_key: str = "", **policy) -> KVState:
    """A KV state whose disk cache is for sessions of `steering_key` (as the daemon makes it:
    the steering in the fingerprint too)."""
    pol = SavePolicy.for_context(CTX, **policy)
    disk = DiskCache(directory, budget_bytes=0, ctx=CTX, min_tokens=pol.min_tokens,
                     fingerprint=engine.info.fingerprint + steering_key)  # fmt: skip
    return KVState(engine.tokenizer, CTX, disk=disk, policy=pol, steering_key=steering_key)


def test_checkpoints_are_never_restored_under_other_steering(engine, steering, tmp_path):
    tok = engine.tokenizer
    plain, steered = make(engine, tmp_path / "plain"), make(engine, tmp_path / "s", steering.key)
    prompt = tok.encode(TALK_A)
    for kv, own, other in ((plain, None, steering), (steered, steering, None)):
        with engine.new_session(CTX) as s:
            s.set_steering(other)  # a session of the other steering writes nothing
            r = sync_session(kv, s, TALK_A, prompt)
            assert (r.source, r.saves) == ("none", [])
            assert kv.shutdown([s]) == 0 and kv.disk.entries() == []
        with engine.new_session(CTX) as s:
            s.set_steering(own)
            assert sync_session(kv, s, TALK_A, prompt).saves == ["cold"]
            assert kv.shutdown([s]) == 1
        more = TALK_A + "The Po."
        with engine.new_session(CTX) as s:  # ... nor reads what its own wrote
            s.set_steering(other)
            assert sync_session(kv, s, more, tok.encode(more)).source == "none"
        with engine.new_session(CTX) as s:
            s.set_steering(own)
            assert sync_session(kv, s, more, tok.encode(more)).source == "disk-text"


def test_a_steering_change_saves_the_slot_its_cache_holds_then_drops_it(engine, steering,
                                                                        tmp_path):  # fmt: skip
    tok = engine.tokenizer
    kv = make(engine, tmp_path / "kv", cold_max_tokens=0)  # no cold saves: evicts only
    with engine.new_session(CTX) as s:
        sync_session(kv, s, TALK_A, tok.encode(TALK_A))
        held = s.n_tokens
        steer_session(s, steering, kv)
        assert (s.n_tokens, s.steering_key) == (0, steering.key)
        assert [e.tokens for e in kv.disk.entries()] == [held]  # saved, as an evict
        steer_session(s, steering, kv)  # the same steering: nothing happens
        assert s.steering is steering
        sync_session(kv, s, TALK_B, tok.encode(TALK_B))
        assert s.n_tokens and len(kv.disk.entries()) == 1  # a steered session: no save
        steer_session(s, None, kv)
        assert (s.n_tokens, s.steering_key) == (0, "")
        assert len(kv.disk.entries()) == 1  # its KV was not this cache's to keep
        # what was saved comes back for the unsteered
        assert sync_session(kv, s, TALK_A, tok.encode(TALK_A)).source == "disk-text"


def test_a_completion_slot_changing_steering_never_restores_across_it(engine, steering):
    """An editor's recent states are kept per steering: after the slot ran another
    steering, the old state is evaluated afresh under the new one, and found again, with
    nothing evaluated, under its own."""
    from tests.state.test_recent import sync, typed

    session, recent = engine.new_session(1024), RecentStates(256 << 20)
    sync(session, recent, typed(3))
    sync(session, recent, typed(4))
    steer_session(session, steering, None)
    assert session.n_tokens == 0 and session.steering_key == steering.key
    assert sync(session, recent, typed(4)) == len(typed(4))  # none of those is steered
    steer_session(session, None, None)
    assert sync(session, recent, typed(4)) == 0  # back: the unsteered state as it was
