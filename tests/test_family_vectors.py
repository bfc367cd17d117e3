"""Accuracy acceptance for every model family: the kit's tiny F16 models (tests/kit.py),
teacher-forced, against transformers' float32 top-20 log-probabilities.

Bar: mean |ours - reference| <= 1e-3 over each sequence's top-20s, and our argmax equals
the reference argmax wherever the reference top-2 margin exceeds 0.01. The first two thirds
of a sequence go through prefill calls (several tokens per call, all logits), the rest
through single-token decode calls, so both paths are measured.

Every family of EXPECTED must have a fixture and an engine module: a missing one fails.
Run with -s to see the per-family distances."""

from __future__ import annotations

import numpy as np
import pytest

from tests.kit import kit_families, kit_manifest, kit_model, kit_reference

EXPECTED = ("llama", "qwen2", "qwen3", "qwen3moe", "gemma3", "phi3", "gpt-oss")
MEAN_ABS_MAX = 1e-3
MARGIN = 0.01
# Tokens per prefill call: small enough that a 262k vocabulary's logits stay ~30 MB,
# and calls start at different offsets within the sliding windows.
PREFILL_CALL = 40


def log_softmax(logits: np.ndarray) -> np.ndarray:
    x = logits.astype(np.float64)
    x -= x.max(axis=-1, keepdims=True)
    return x - np.log(np.exp(x).sum(axis=-1, keepdims=True))


def test_kit_holds_every_expected_family() -> None:
    assert sorted(EXPECTED) == kit_families()


def teacher_forced_logprobs(engine, tokens: np.ndarray, top_ids: np.ndarray) -> np.ndarray:
    """Our log-probabilities of the reference's top ids at every position, and our argmax
    per position as the last column."""
    n = len(tokens)
    split = 2 * n // 3
    out = np.empty((n, top_ids.shape[1] + 1))
    session = engine.new_session(n)
    try:
        pos = 0
        while pos < n:
            if pos < split:
                end = min(pos + PREFILL_CALL, split)
                logits = session.eval_all_logits(tokens[pos:end].tolist())
            else:
                end = pos + 1
                session.eval([int(tokens[pos])])
                logits = session.logits[None, :]
            lp = log_softmax(logits)
            rows = np.arange(end - pos)
            out[pos:end, :-1] = lp[rows[:, None], top_ids[pos:end]]
            out[pos:end, -1] = lp.argmax(axis=-1)
            pos = end
    finally:
        session.close()
    return out


@pytest.mark.timeout(900)
@pytest.mark.parametrize("family", EXPECTED)
def test_family_matches_transformers(family: str) -> None:
    from ds4d.engine import Engine
    from ds4d.engine.engine import FAMILIES

    arch = kit_manifest(family)["architecture"]
    assert arch in FAMILIES, f"the engine has no family for architecture {arch!r} yet"
    failures = []
    with Engine.open(kit_model(family), threads=2) as engine:
        for seq in kit_reference(family):
            ours = teacher_forced_logprobs(engine, seq.tokens, seq.top_ids)
            diff = np.abs(ours[:, :-1] - seq.top_logprobs)
            mean = float(diff.mean())
            margin = seq.top_logprobs[:, 0] - seq.top_logprobs[:, 1]
            misses = np.nonzero((margin > MARGIN) & (ours[:, -1] != seq.top_ids[:, 0]))[0]
            print(f"{family} {seq.name}: {len(seq.tokens)} tokens, mean |Δ logprob| "
                  f"{mean:.2e}, max {diff.max():.2e}, argmax misses {len(misses)}")  # fmt: skip
            if mean > MEAN_ABS_MAX:
                failures.append(f"{seq.name}: mean |Δ| {mean:.2e} > {MEAN_ABS_MAX}")
            if len(misses):
                failures.append(f"{seq.name}: argmax differs at positions {misses.tolist()}")
    assert not failures, f"{family}: " + "; ".join(failures)
