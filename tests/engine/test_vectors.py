"""Accuracy acceptance: teacher-forced over every SmolLM2 case in tests/data/vectors, our top-20
log-probabilities against the exact float32 forward (*.exact.json).

Bar: mean |ours - exact| <= 0.05 over every step's top-20 (llama.cpp is about 0.1 away),
and our argmax equals the exact argmax wherever the exact top-2 margin exceeds 0.05."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

MEAN_ABS_MAX = 0.05
MARGIN = 0.05
CASES_DIR = "vectors/smollm2"


def case_names() -> list[str]:
    from tests.conftest import DATA

    found = sorted(p.name.removesuffix(".exact.json")
                   for p in (DATA / CASES_DIR).glob("*.exact.json"))  # fmt: skip
    return found or ["(no cases found)"]


def log_softmax(logits: np.ndarray) -> np.ndarray:
    x = logits.astype(np.float64)
    x -= x.max()
    return x - np.log(np.exp(x).sum())


@pytest.mark.timeout(600)
@pytest.mark.parametrize("case", case_names())
def test_teacher_forced_logprobs_match_exact(exact_engine, data_dir: Path, case: str) -> None:
    path = data_dir / CASES_DIR / f"{case}.exact.json"
    if not path.is_file():
        pytest.skip(f"no exact vectors under {data_dir / CASES_DIR}")
    exact = json.loads(path.read_text())
    steps = exact["steps"]
    session = exact_engine.new_session(len(exact["prompt_tokens"]) + len(steps))
    session.eval(exact["prompt_tokens"])
    diffs, argmax_misses = [], []
    for i, step in enumerate(steps):
        ours = log_softmax(session.compute_logits())
        ids = np.array([t for t, _ in step["top"]])
        want = np.array([lp for _, lp in step["top"]])
        diffs.append(np.abs(ours[ids] - want).mean())
        if want[0] - want[1] > MARGIN and int(np.argmax(ours)) != int(ids[0]):
            argmax_misses.append(i)
        session.eval([step["token"]])
    mean = float(np.mean(diffs))
    print(f"{case}: {len(steps)} steps, mean |Δ logprob| {mean:.2e}, max step {max(diffs):.2e}")
    assert mean <= MEAN_ABS_MAX
    assert not argmax_misses, f"argmax differs at steps {argmax_misses}"
