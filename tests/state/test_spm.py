"""Prefix reuse on a SentencePiece vocabulary with add_space_prefix (the kit's phi3).

Such a tokenizer (as llama.cpp's) puts a space piece first in every text span: at the
start and after each special token, so `<|user|>hi` is `<|user|>, ▁hi`; Phi-3's special
tokens also drop the whitespace after them (`<|user|>\\nhi` is the same two tokens). A slot
is keyed by the text that tokenizes to its tokens (that canonical text, without the
dropped whitespace), not by their plain decoding (which has a space after every special
token), and text continuing a span is tokenized without that space: a conversation's next turn reuses everything the slot holds, from memory and from
a disk checkpoint after a restart."""

from __future__ import annotations

from collections.abc import Iterator

import numpy as np
import pytest

from ds4d.state.diskcache import DiskCache
from ds4d.state.kvstate import KVState
from ds4d.state.savepolicy import SavePolicy
from ds4d.state.sync import sync_session
from tests.helpers.kit import kit_model

CTX = 1024
SYSTEM = "You answer questions about rivers, their deltas and the towns along them. " * 6
TURN = f"<|system|>\n{SYSTEM}<|end|>\n<|user|>\nTell me about the Po.<|end|>\n<|assistant|>\n"
REPLY = "The Po flows east  across northern Italy, to a wide delta."
NEXT = "<|end|>\n<|user|>\nAnd the Tiber?<|end|>\n<|assistant|>\n"


@pytest.fixture(scope="module")
def engine() -> Iterator:
    from ds4d.engine import Engine

    with Engine.open(kit_model("phi3"), threads=2) as e:
        yield e


def tokenize_prompt(tok, text: str) -> list[int]:
    """As the daemon tokenizes a rendered prompt: BOS first, the template omits it."""
    return [tok.bos_id, *tok.encode(text)]


def make(engine, tmp_path=None) -> KVState:
    disk = None
    pol = SavePolicy.for_context(CTX)
    if tmp_path is not None:
        disk = DiskCache(tmp_path / "kv", budget_bytes=0, fingerprint=engine.info.fingerprint,
                         ctx=CTX, min_tokens=pol.min_tokens)  # fmt: skip
    return KVState(engine.tokenizer, CTX, disk=disk, policy=pol)


def test_the_vocabulary_puts_a_space_piece_after_special_tokens(engine) -> None:
    tok = engine.tokenizer
    assert tok.add_space_prefix and tok.add_bos
    ids = tok.encode("<|user|>\nhi")
    assert ids == tok.encode("<|user|>hi")  # the newline after <|user|> is dropped
    assert [tok.token_text(i) for i in ids] == ["<|user|>", "▁hi"]
    assert tok.decode(ids) == "<|user|> hi"  # so the plain decoding is no key


def test_key_text_is_the_text_that_tokenizes_to_the_tokens(engine) -> None:
    tok = engine.tokenizer
    kv = make(engine)
    tokens = tokenize_prompt(tok, TURN)
    assert kv.key_text(tokens) == "<s>" + tok.canonical_text(TURN)  # not "<s><|system|> ..."
    assert kv.full_text(TURN) == "<s>" + tok.canonical_text(TURN)
    assert kv.full_text(kv.full_text(TURN)) == kv.full_text(TURN)
    # a span that does not open with the space piece comes from no text
    word = tok.encode_continuation("hello")[0]
    assert not tok.token_bytes(word).startswith(b" ")
    assert kv.key_text([tok.bos_id, word]) is None
    assert kv.key_text(tok.encode("<|user|>")) == "<|user|>"


def test_continuation_tokens_get_no_space_prefix(engine) -> None:
    tok = engine.tokenizer
    head, tail = "<|user|>\nWeather", " in Paris?<|end|>\nhi"
    assert tok.encode(head) + tok.encode_continuation(tail) == tok.encode(head + tail)
    assert tok.encode_continuation(tail) != tok.encode(tail)  # which doubles the space
    forced = '<tool_call>\n{"name": '
    after = tok.encode("<|assistant|>\n")
    assert after == [tok.token_to_id("<|assistant|>")]  # the newline is dropped
    # so the forced text opens a new span (with its space piece), as encode_after does
    kv = make(engine)
    assert after + kv.encode_after(after, forced) == tok.encode("<|assistant|>\n" + forced)
    # text opening with a special token is tokenized as always
    assert tok.encode_continuation(NEXT) == tok.encode(NEXT)
    assert tok.encode_continuation("") == []


def held_conversation(kv: KVState, session, tok) -> list[int]:
    """The first turn prefilled, then a reply written after it (as a decode does)."""
    r = sync_session(kv, session, TURN, tokenize_prompt(tok, TURN))
    assert r.source == "none"
    # sampled in two pieces split inside a word: not the tokens the text gives back
    cut = REPLY.index("Po") + 1
    for piece in (REPLY[:cut], REPLY[cut:]):
        session.eval(kv.encode_after(session.tokens, piece))
    return list(session.tokens)


def test_next_turn_reuses_the_whole_slot_from_memory(engine) -> None:
    tok = engine.tokenizer
    kv = make(engine)
    text = TURN + REPLY + NEXT
    with engine.new_session(CTX) as s:
        held = held_conversation(kv, s, tok)
        assert kv.key_text(held) == "<s>" + tok.canonical_text(TURN + REPLY)
        assert tokenize_prompt(tok, TURN + REPLY) != held
        r = sync_session(kv, s, text, tokenize_prompt(tok, text))
        assert r.source == "memory-text" and r.cached_tokens == len(held)
        assert s.tokens[: len(held)] == held
        assert kv.key_text(s.tokens) == kv.full_text(text)


def test_next_turn_after_a_restart_loads_the_whole_slot_from_disk(engine, tmp_path) -> None:
    tok = engine.tokenizer
    kv = make(engine, tmp_path)
    with engine.new_session(CTX) as s:
        held = held_conversation(kv, s, tok)
        assert kv.shutdown([s]) == 1

    kv2 = make(engine, tmp_path)  # a new process: fresh index over the same directory
    text = TURN + REPLY + NEXT
    with engine.new_session(CTX) as s:
        r = sync_session(kv2, s, text, tokenize_prompt(tok, text))
        assert r.source == "disk-text" and r.cached_tokens == len(held)
        assert kv2.disk.stats.shortfalls == 0
        assert s.tokens[: len(held)] == held
        assert kv2.key_text(s.tokens) == kv2.full_text(text)
        with engine.new_session(CTX) as cold:
            cold.eval(list(s.tokens))
            np.testing.assert_allclose(s.compute_logits(), cold.compute_logits(), atol=2e-3)
