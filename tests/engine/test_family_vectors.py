"""Accuracy acceptance for every model family: the kit's tiny F16 models (tests/helpers/kit.py),
teacher-forced, against transformers' float32 top-20 log-probabilities.

Bar: mean |ours - reference| <= 1e-3 over each sequence's top-20s, and our argmax equals
the reference argmax wherever the reference top-2 margin exceeds 0.01. Each sequence goes
through prefill calls first and single-token decode calls after (see kit.teacher_forced).

Every family of EXPECTED must have a fixture and an engine module: a missing one fails.
Run with -s to see the per-family distances."""

from __future__ import annotations

import hashlib

import pytest

from tests.helpers.kit import kit_families, kit_manifest, kit_model, kit_reference, teacher_forced

EXPECTED = ("llama", "qwen2", "qwen3", "qwen3moe", "gemma3", "phi3", "gpt-oss", "gpt-oss-mxfp4")
MEAN_ABS_MAX = 1e-3
MARGIN = 0.01


def test_kit_holds_every_expected_family() -> None:
    assert sorted(EXPECTED) == kit_families()


@pytest.mark.parametrize("family", EXPECTED)
def test_kit_rebuilds_the_exact_gguf(family: str) -> None:
    """The cached GGUF is byte for byte the converter's output (whether or not the engine
    runs that family yet)."""
    path = kit_model(family)
    assert hashlib.sha256(path.read_bytes()).hexdigest() == kit_manifest(family)["sha256"]


@pytest.mark.timeout(900)
@pytest.mark.parametrize("family", EXPECTED)
def test_family_matches_transformers(family: str) -> None:
    from ds4d.engine import Engine
    from ds4d.engine.engine import FAMILIES

    arch = kit_manifest(family)["architecture"]
    assert arch in FAMILIES, f"the engine has no family for architecture {arch!r} yet"
    failures = []
    # The exact float32 KV: these vectors measure the forward pass, not KV rounding.
    with Engine.open(kit_model(family), threads=2, kv_type="f32") as engine:
        for seq in kit_reference(family):
            c = teacher_forced(engine, seq, MARGIN)
            print(f"{family} {seq.name}: {len(seq.tokens)} tokens, mean |Δ logprob| "
                  f"{c.mean_abs:.2e}, max {c.max_abs:.2e}, argmax misses {len(c.argmax_misses)}")  # fmt: skip
            if c.mean_abs > MEAN_ABS_MAX:
                failures.append(f"{seq.name}: mean |Δ| {c.mean_abs:.2e} > {MEAN_ABS_MAX}")
            if c.argmax_misses:
                failures.append(f"{seq.name}: argmax differs at positions {c.argmax_misses}")
    assert not failures, f"{family}: " + "; ".join(failures)
