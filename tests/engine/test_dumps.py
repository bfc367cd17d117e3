"""`ds4d generate --dump-*` as a user runs them (a real process, the embedded model): the
token listing, and logprob/logit documents in the shape of the project's own vectors
(tests/data/vectors/smollm2/<case>.json) whose values match the exact float32 forward
(<case>.exact.json) for as long as our greedy continuation follows the vector's tokens."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from tests.conftest import DATA, REPO

CASES = DATA / "vectors" / "smollm2"
MEAN_ABS_MAX = 0.05  # tests/engine/test_vectors.py's bar for our log-probabilities against exact


def ds4d(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "ds4d", "generate", "--threads", "2", *args],
        cwd=REPO, env=dict(os.environ, PYTHONUNBUFFERED="1"),
        capture_output=True, text=True, timeout=240,
    )  # fmt: skip


def shape(doc: Any) -> Any:
    """The document's structure: key order and value types, values left out."""
    if isinstance(doc, dict):
        return {k: shape(v) for k, v in doc.items()}
    if isinstance(doc, list):
        return [shape(doc[0])] if doc else []
    return (
        "number"
        if isinstance(doc, int | float) and not isinstance(doc, bool)
        else type(doc).__name__
    )


def test_dump_tokens_lists_the_prompt_as_the_engine_sees_it() -> None:
    golden = json.loads((CASES / "chat_capital.json").read_text())
    r = ds4d("-p", "What is the capital of France?", "--dump-tokens")
    assert r.returncode == 0, r.stderr
    rows = [line.split(maxsplit=2) for line in r.stdout.splitlines()]
    assert [int(row[1]) for row in rows] == golden["prompt_tokens"]
    assert rows[0][2] == '"<|im_start|>" special'  # the chat markers are single special tokens
    assert rows[3][2] == '"You"'


@pytest.mark.parametrize(
    "case,args",
    [("chat_capital", ["-p", "What is the capital of France?"]), ("raw_code", ["--raw"])],
)
def test_dump_logprobs_reproduces_a_vector_file(tmp_path: Path, case: str, args: list[str]) -> None:
    golden = json.loads((CASES / f"{case}.json").read_text())
    exact = json.loads((CASES / f"{case}.exact.json").read_text())
    if "--raw" in args:
        prompt_file = tmp_path / f"{case}.txt"
        prompt_file.write_text(golden["prompt"])
        args = [*args, "--prompt-file", str(prompt_file)]
    out, logits_out = tmp_path / "dump.json", tmp_path / "logits.json"
    n = len(golden["steps"])
    r = ds4d(*args, "-n", str(n), "--dump-logprobs", str(out), "--dump-logits", str(logits_out),
             "--logprobs-top-k", str(golden["top_k"]), "--dump-id", case)  # fmt: skip
    assert r.returncode == 0, r.stderr
    doc = json.loads(out.read_text())
    # the same document: keys in the same order, same value types, same prompt and ids
    assert shape(doc) == shape(golden)
    for key in ("schema", "id", "chat", "prompt", "prompt_tokens", "top_k"):
        assert doc[key] == golden[key], key
    # values: the exact forward's, step by step while our tokens follow the vector's
    # (exact is teacher-forced with the vector's tokens)
    diffs = []
    for ours, want, vec in zip(doc["steps"], exact["steps"], golden["steps"], strict=False):
        got = dict((t, lp) for t, lp in ours["top"])
        diffs += [abs(got[t] - lp) for t, lp in want["top"] if t in got]
        if ours["token"] != vec["token"]:
            break
        assert ours["bytes"] == vec["bytes"]
    assert len(diffs) >= 15 and float(np.mean(diffs)) <= MEAN_ABS_MAX, np.mean(diffs)
    # internal consistency: greedy, sorted tops, the logits document agrees
    full = json.loads(logits_out.read_text())
    for step, with_logits in zip(doc["steps"], full["steps"], strict=True):
        lps = [lp for _, lp in step["top"]]
        assert lps == sorted(lps, reverse=True) and step["top"][0][0] == step["token"]
        assert step["logprob"] == step["top"][0][1]
        logits = np.array(with_logits["logits"], np.float64)
        assert len(logits) == 49152 and int(np.argmax(logits)) == step["token"]
        lse = logits.max() + np.log(np.exp(logits - logits.max()).sum())
        assert abs((logits[step["token"]] - lse) - step["logprob"]) < 1e-6


def test_dump_rejects_bad_arguments(tmp_path: Path) -> None:
    r = ds4d("-p", "x", "--dump-logprobs", str(tmp_path / "o.json"), "--logprobs-top-k", "0")
    assert r.returncode == 2 and "--logprobs-top-k" in r.stderr
    r = ds4d("--prompt-file", str(tmp_path / "missing.txt"), "--dump-tokens")
    assert r.returncode == 2 and "cannot read --prompt-file" in r.stderr
