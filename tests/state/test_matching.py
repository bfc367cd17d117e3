"""Matching order and save policy as pure functions, with the real SmolLM2 tokenizer."""

from __future__ import annotations

import pytest

from ds4d.state.diskcache import DiskCache
from ds4d.state.kvfile import Reason
from ds4d.state.matching import common_prefix, disk_effective, plan_sync
from ds4d.state.savepolicy import SavePolicy


@pytest.fixture(scope="module")
def tok(model_path):
    from ds4d.engine.tokenizer import Tokenizer

    # ds4d's own GGUF reader: the gguf package's takes seconds over the vocabulary
    # (tests/engine/test_tokenizer.py builds the same tokenizer through it)
    return Tokenizer.from_gguf(model_path)


def chat(*turns):
    out = ""
    for role, text in turns:
        out += f"<|im_start|>{role}\n{text}<|im_end|>\n"
    return out + "<|im_start|>assistant\n"


def plan(tok, live, text, **kw):
    return plan_sync(
        live,
        text,
        tok.encode(text),
        decode=tok.decode,
        encode=tok.encode,
        min_tokens=kw.pop("min_tokens", 8),
        **kw,
    )


def test_memory_token(tok):
    first = chat(("user", "What is the capital of Italy?"))
    live = tok.encode(first) + tok.encode("Rome.")
    nxt = first + "Rome.<|im_end|>\n<|im_start|>user\nAnd France?<|im_end|>\n"
    p = plan(tok, live, nxt)
    assert p.source == "memory-token" and p.keep == len(live) and p.tokens == tok.encode(nxt)


def test_memory_text_keeps_live_tokens_and_tokenizes_only_the_rest(tok):
    # the live tokens spell "Rom" + "e." in a way the full tokenization would merge
    base = chat(("user", "Capital of Italy?"))
    live = tok.encode(base) + tok.encode("Rom") + tok.encode("e")
    text = base + "Rome. And of France?"
    full = tok.encode(text)
    assert common_prefix(live, full) < len(live)  # token match impossible
    p = plan(tok, live, text)
    assert p.source == "memory-text" and p.keep == len(live)
    assert p.tokens[: len(live)] == live and tok.decode(p.tokens) == text


def test_partial_rewind_disk_and_cold(tok, tmp_path):
    system = chat(("system", "You are a careful assistant. " * 12))[
        : -len("<|im_start|>assistant\n")
    ]
    a = system + chat(("user", "Tell me about apples."))
    b = system + chat(("user", "Tell me about pears, please."))
    live = tok.encode(a) + tok.encode("Apples are fruit.")
    p = plan(tok, live, b)
    assert p.source == "memory-token" and 0 < p.keep < len(live)
    assert p.keep == common_prefix(live, tok.encode(b)) and p.miss_reason == "token-mismatch"
    assert p.evict_save == (len(live) - p.keep >= 8)
    assert plan(tok, live, b, can_rewind=False).source == "none"

    disk = DiskCache(tmp_path, budget_bytes=0, fingerprint="m", ctx=8192, min_tokens=8)
    b_tokens = tok.encode(b)
    entry = disk.save(Reason.COLD, tok.decode(b_tokens[:-3]), len(b_tokens) - 3, b"kv")
    p = plan(tok, live, b, lookup=disk.lookup)
    assert p.source == "disk-text" and p.disk.entry.name == entry.name and p.evict_save
    assert p.promised == len(b_tokens) - 3
    loaded = disk.load(p.disk, b)
    eff = disk_effective(b_tokens[:-3], loaded.text, b, tok.encode)
    assert tok.decode(eff) == b and eff[: len(b_tokens) - 3] == b_tokens[:-3]

    cold = plan(tok, [], b, lookup=lambda text: None)
    assert (cold.source, cold.keep, cold.miss_reason) == ("none", 0, "no-live-checkpoint")


def test_identical_prompt_rewinds_one_token(tok):
    text = chat(("user", "hello there"))
    live = tok.encode(text) + tok.encode("General Kenobi")
    p = plan(tok, live, text)
    assert p.source == "memory-token" and p.keep == len(tok.encode(text)) - 1


def test_save_policy_boundaries():
    p = SavePolicy()  # ds4's defaults
    assert p.store_len(11011) == 10240 and p.store_len(1695) == 1695
    assert SavePolicy(boundary_trim_tokens=0, boundary_align_tokens=1000).store_len(3500) == 3000
    assert SavePolicy(boundary_align_tokens=0).store_len(3500) == 3468
    assert p.continued_step == 10240
    assert SavePolicy(boundary_align_tokens=0).continued_step == 10000
    assert p.cold_boundary(11011, cached=0) == 10240
    assert p.cold_boundary(11011, cached=5) is None  # only complete misses
    assert p.cold_boundary(400, cached=0) is None and p.cold_boundary(40000, cached=0) is None
    assert p.cold_boundary(11011, cached=0, anchor=900) == 900
    assert p.continued_due(20480, 10240) and not p.continued_due(20480, 20480)
    assert not p.continued_due(15000, 0) and p.next_continued(10240) == 20480
    with pytest.raises(ValueError):
        SavePolicy(min_tokens=600, cold_max_tokens=500)


def test_save_policy_fits_small_context():
    p = SavePolicy.for_context(8192)
    # a ~6000-token prompt gets a cold checkpoint covering most of it
    assert p.cold_boundary(6000, cached=0) >= 5600
    assert p.cold_max_tokens == 8192 and p.continued_step <= 8192 // 2
    assert SavePolicy.for_context(8192, min_tokens=100, cold_max_tokens=None).min_tokens == 100
