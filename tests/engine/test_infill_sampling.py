"""llama.cpp's infill sampler rule (ds4d.engine.infill_sampling) on hand-made logits over
a real vocabulary (the qwen2 kit's: Qwen2.5's tokenizer)."""

from __future__ import annotations

import functools

import numpy as np

from ds4d.engine.infill_sampling import infill_rule_for
from ds4d.engine.sampler import SamplingParams, make_rng, sample
from ds4d.engine.tokenizer import Tokenizer
from tests.helpers.kit import kit_model


@functools.cache
def tok() -> Tokenizer:
    return Tokenizer.from_gguf(kit_model("qwen2"))


def logits_for(probs: dict[int, float]) -> np.ndarray:
    out = np.full(tok().n_vocab, -30.0, np.float32)
    for i, p in probs.items():
        out[i] = np.log(p)
    return out


def one(text: str) -> int:
    ids = tok().encode(text, special=False)
    assert len(ids) == 1, (text, ids)
    return ids[0]


def test_mass_on_end_of_generation_leaves_only_those_tokens():
    rule = infill_rule_for(tok())
    assert rule is not None
    eos = tok().eos_id
    logits = logits_for({one("return"): 0.5, one("pass"): 0.3, eos: 0.2})
    assert rule.candidates(logits, 40, 1.0, 0.0).tolist() == [eos]


def test_a_token_that_starts_another_gives_it_its_probability():
    rule = infill_rule_for(tok())
    ret, re_, pa = one("return"), one("re"), one("pass")
    # "re" (0.1) starts "return" (0.15): "return" gets 0.25 and passes the 0.2 bar it
    # would miss alone; "pass" (0.35) passes on its own; "re" is merged away
    rest = {one(t): 0.1 for t in "wxyz"}
    logits = logits_for({ret: 0.15, re_: 0.1, pa: 0.35, **rest})
    got = rule.candidates(logits, 40, 1.0, 0.0).tolist()
    assert sorted(got) == sorted([ret, pa])


def test_no_text_candidate_left_ends_the_completion():
    rule = infill_rule_for(tok())
    flat = {one(t): 0.1 for t in "abcdefghij"}  # ten tokens at 0.1: all under 0.2
    assert rule.candidates(logits_for(flat), 40, 1.0, 0.0).tolist() == [rule.end_id]


def test_the_draw_is_among_the_survivors():
    rule = infill_rule_for(tok())
    ret, pa = one("return"), one("pass")
    logits = logits_for({ret: 0.5, pa: 0.4, one("x"): 0.1})
    params = SamplingParams(temperature=1.0, top_k=40, infill=rule)
    rng = make_rng(1)
    drawn = {sample(logits, params, rng) for _ in range(50)}
    assert drawn == {ret, pa}
