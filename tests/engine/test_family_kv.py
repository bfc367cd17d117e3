"""The KV type each family gets by default ("auto", ds4d.engine.engine.FAMILY_KV_TYPE), held
to the accuracy bar on the verification kit: teacher-forced against transformers' float32
top-20s, every sequence of every family within 0.003 mean |Δ logprob| with the defaults
(tests/engine/test_family_vectors.py holds the exact f32 KV to 1e-3). A family whose f16 KV costs
more than that (gpt-oss, phi3, qwen3moe: docs/kv-precision.md) defaults to f32; run with -s
to see the figures."""

from __future__ import annotations

import pytest

from ds4d.engine import Engine
from ds4d.engine.engine import FAMILY_KV_TYPE
from tests.engine.test_family_vectors import EXPECTED, MARGIN
from tests.helpers.kit import kit_model, kit_reference, teacher_forced

DEFAULT_MEAN_ABS_MAX = 0.003


@pytest.mark.timeout(900)
@pytest.mark.parametrize("family", EXPECTED)
def test_default_kv_type_meets_the_bar(family: str) -> None:
    with Engine.open(kit_model(family), threads=2) as engine:
        kv = engine.kv_type
        means = {s.name: teacher_forced(engine, s, MARGIN).mean_abs for s in kit_reference(family)}
    print(f"{family} default kv {kv}: " + ", ".join(f"{n} {m:.2e}" for n, m in means.items()))
    over = {n: m for n, m in means.items() if m > DEFAULT_MEAN_ABS_MAX}
    assert not over, f"{family} with kv {kv}: mean |Δ logprob| over {DEFAULT_MEAN_ABS_MAX}: {over}"


def test_auto_is_the_family_choice_and_an_explicit_type_wins() -> None:
    assert set(FAMILY_KV_TYPE) == {"gpt-oss", "phi3", "qwen3moe"}
    with Engine.open(kit_model("gpt-oss"), threads=1) as e:
        assert e.kv_type == "f32" and e.info.kv_type == "f32"
    with Engine.open(kit_model("gpt-oss"), threads=1, kv_type="f16") as e:
        assert e.kv_type == "f16"
    with Engine.open(kit_model("llama"), threads=1, kv_type="auto") as e:
        assert e.kv_type == "f16"
