"""KVState with the real engine: cold/continued/evict/shutdown checkpoints, disk hits that
give exactly the logits of a cold prefill, bad files going cold, restarts."""

from __future__ import annotations

import io
import struct

import numpy as np
import pytest

from ds4d.state import kvfile
from ds4d.state.diskcache import DiskCache
from ds4d.state.kvstate import KVState
from ds4d.state.savepolicy import SavePolicy
from ds4d.state.sync import sync_session

CTX = 1024


def chat(*turns, open_assistant=True):
    out = "".join(f"<|im_start|>{r}\n{t}<|im_end|>\n" for r, t in turns)
    return out + ("<|im_start|>assistant\n" if open_assistant else "")


SYSTEM = ("system", "You are a helpful assistant who answers questions about rivers. " * 8)
TALK_A = chat(SYSTEM, ("user", "Tell me about the Po river and its delta, in detail. " * 6))
TALK_B = chat(
    ("system", "You write short poems about the sea and its moods. " * 8),
    ("user", "A poem about waves at dusk, please. " * 6),
)


def make(engine, tmp_path, **policy) -> KVState:
    pol = SavePolicy.for_context(CTX, **policy)
    disk = DiskCache(tmp_path / "kv", budget_bytes=0, fingerprint=engine.info.fingerprint,
                     ctx=CTX, min_tokens=pol.min_tokens)  # fmt: skip
    return KVState(engine.tokenizer, CTX, disk=disk, policy=pol)


def cold_logits(engine, tokens):
    with engine.new_session(CTX) as s:
        s.eval(tokens)
        return np.array(s.compute_logits())


def test_cold_then_restart_from_shutdown_checkpoint(engine, tmp_path):
    tok = engine.tokenizer
    kv = make(engine, tmp_path)
    prompt = tok.encode(TALK_A)
    with engine.new_session(CTX) as s:
        r = sync_session(kv, s, TALK_A, prompt)
        assert (r.source, r.cached_tokens, r.saves) == ("none", 0, ["cold"])
        assert s.tokens == prompt
        (cold_file,) = kv.disk.entries()
        assert cold_file.tokens == kv.policy.store_len(len(prompt)) < len(prompt)
        s.eval(tok.encode("The Po is the longest river in Italy."))  # "generated"
        held = s.tokens
        assert kv.shutdown([s]) == 1

    # a new process: fresh cache index, fresh session, same conversation plus a turn
    kv2 = make(engine, tmp_path)
    text = tok.decode(held) + "<|im_end|>\n" + chat(("user", "And the Tiber?"))
    full = tok.encode(text)
    with engine.new_session(CTX) as s:
        r = sync_session(kv2, s, text, full)
        assert r.source == "disk-text" and r.cached_tokens == len(held)
        assert kv2.disk.stats.shortfalls == 0
        assert r.disk_file == kvfile.file_name(tok.decode(held))
        assert tok.decode(s.tokens) == text
        np.testing.assert_allclose(s.compute_logits(), cold_logits(engine, s.tokens), atol=2e-3)
    assert kvfile.read_header(kv2.disk.dir / r.disk_file).hits == 1


def test_evict_save_then_disk_hit_in_the_same_slot(engine, tmp_path):
    tok = engine.tokenizer
    kv = make(engine, tmp_path, cold_max_tokens=0)  # no cold saves: only evict remains
    with engine.new_session(CTX) as s:
        sync_session(kv, s, TALK_A, tok.encode(TALK_A))
        a_tokens = s.tokens
        r = sync_session(kv, s, TALK_B, tok.encode(TALK_B))
        assert r.source == "none" and r.saves == ["evict"]
        assert [e.tokens for e in kv.disk.entries()] == [len(a_tokens)]
        again = TALK_A + "The Po."
        r = sync_session(kv, s, again, tok.encode(again))
        assert r.source == "disk-text" and r.cached_tokens == len(a_tokens)
        assert r.saves == ["evict"]  # TALK_B was worth keeping too
        assert s.tokens[: len(a_tokens)] == a_tokens


def test_memory_reuse_and_continued_frontiers(engine, tmp_path):
    tok = engine.tokenizer
    kv = make(engine, tmp_path, continued_interval_tokens=128, cold_max_tokens=0)
    step = kv.policy.continued_step
    prompt = tok.encode(TALK_A)
    with engine.new_session(CTX) as s:
        r = sync_session(kv, s, TALK_A, prompt)
        frontiers = sorted(e.tokens for e in kv.disk.entries())
        assert frontiers == list(range(step, len(prompt) + 1, step))
        assert r.saves == ["continued"] * len(frontiers)
        # memory-token: nothing prefilled again, nothing saved again
        more = TALK_A + "The Po river"
        r = sync_session(kv, s, more, tok.encode(more))
        assert r.source in ("memory-token", "memory-text") and r.cached_tokens == len(prompt)
        # decode steps reach the next frontier: after_token saves exactly there
        while len(s.tokens) % step:
            assert not kv.after_token(s)
            s.eval([tok.encode(" and")[0]])
        assert kv.after_token(s)
        assert max(e.tokens for e in kv.disk.entries()) == len(s.tokens)


def test_corrupt_checkpoint_goes_cold(engine, tmp_path):
    tok = engine.tokenizer
    kv = make(engine, tmp_path)
    with engine.new_session(CTX) as s:
        sync_session(kv, s, TALK_A, tok.encode(TALK_A))
    (entry,) = kv.disk.entries()
    raw = bytearray(entry.path.read_bytes())
    raw[-100] ^= 0xFF  # inside the KV rows
    entry.path.write_bytes(bytes(raw))

    kv2 = make(engine, tmp_path)
    with engine.new_session(CTX) as s:
        r = sync_session(kv2, s, TALK_A, tok.encode(TALK_A))
        assert r.source == "none" and r.cached_tokens == 0 and s.tokens == tok.encode(TALK_A)
    assert kv2.disk.stats.load_failures == 1
    assert (kv2.disk.quarantine_dir / entry.name).exists()
    assert r.saves == ["cold"]  # and the good checkpoint is written again


def test_foreign_payload_refused_by_engine(engine, tmp_path):
    """A file whose header claims this model but whose payload is not a session."""
    tok = engine.tokenizer
    kv = make(engine, tmp_path)
    text = tok.decode(tok.encode(TALK_A)[:300])
    kv.disk.save(kvfile.Reason.COLD, text, 300, b"not a session payload" * 10)
    with engine.new_session(CTX) as s:
        r = sync_session(kv, s, TALK_A, tok.encode(TALK_A))
        assert r.source == "none" and s.tokens == tok.encode(TALK_A)
    assert kv.disk.stats.load_failures == 1


def test_no_checkpoint_ends_inside_a_character(engine, tmp_path):
    """A key ending inside a UTF-8 sequence could never prefix a prompt: not written."""
    tok = engine.tokenizer
    kv = make(engine, tmp_path)
    crab = tok.encode("🦀")
    assert len(crab) > 1  # byte-level pieces of one character
    with engine.new_session(CTX) as s:
        s.eval(tok.encode(TALK_A) + crab[:-1])
        assert kv.key_text(s.tokens) is None and not kv.save_session(s)
        s.eval(crab[-1:])
        assert kv.key_text(s.tokens).endswith("🦀") and kv.save_session(s)
    assert [e.tokens for e in kv.disk.entries()] == [len(tok.encode(TALK_A)) + len(crab)]


def _payload_with_token(engine, tokens, at: int, value: int) -> bytes:
    """A real session payload whose token `at` is replaced by `value` (checksums are
    computed over it afterwards, so only the content is wrong)."""
    from ds4d.engine.engine import _HEADER

    with engine.new_session(CTX) as s:
        s.eval(tokens)
        buf = io.BytesIO()
        s.save(buf)
    raw = bytearray(buf.getvalue())
    struct.pack_into("<i", raw, _HEADER.size + 4 * at, value)
    return bytes(raw)


@pytest.mark.parametrize("bad_id", ["n_vocab", -1, 2**31 - 1])
def test_checkpoint_with_out_of_range_token_ids_is_refused_and_goes_cold(engine, tmp_path, bad_id):
    tok = engine.tokenizer
    kv = make(engine, tmp_path)
    prompt = tok.encode(TALK_A)
    head = prompt[:300]
    value = engine.info.n_vocab if bad_id == "n_vocab" else bad_id
    kv.disk.save(
        kvfile.Reason.COLD,
        tok.decode(head),
        len(head),
        _payload_with_token(engine, head, 17, value),
    )
    (entry,) = kv.disk.entries()
    with engine.new_session(CTX) as s:
        r = sync_session(kv, s, TALK_A, prompt)
        assert r.source == "none" and r.cached_tokens == 0 and s.tokens == prompt
    assert kv.disk.stats.load_failures == 1
    assert (kv.disk.quarantine_dir / entry.name).exists()


def test_shutdown_saves_every_other_slot_when_one_cannot_be_saved(engine, tmp_path):
    tok = engine.tokenizer
    kv = make(engine, tmp_path)
    prompt = tok.encode(TALK_A)
    with engine.new_session(CTX) as bad, engine.new_session(CTX) as good:
        # A session holding an id outside the vocabulary, as one restored without the
        # checks above would (Session.load itself now refuses such a payload).
        bad.eval(prompt)
        bad._tokens[5] = engine.info.n_vocab + 7
        good.eval(tok.encode(TALK_B))
        assert kv.shutdown([bad, good]) == 1
    (entry,) = kv.disk.entries()
    assert entry.tokens == len(tok.encode(TALK_B))
