"""`ds4d eval` as a user runs it: the extractors' self-tests, and the embedded question set
on the embedded model with 2 threads — to completion within 5 minutes (the timeout), every
question reported, and the same replies when run again (greedy decoding is stable)."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from ds4d.cli.evalset import QUESTIONS, Question, judge, self_test
from tests.conftest import REPO


def ds4d(*args: str, timeout: float = 300) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "ds4d", "eval", *args],
        cwd=REPO, env=dict(os.environ, PYTHONUNBUFFERED="1"),
        capture_output=True, text=True, timeout=timeout,
    )  # fmt: skip


def test_extractor_self_tests_pass() -> None:
    assert self_test() == []
    r = ds4d("--self-test")
    assert r.returncode == 0 and "extractor self-test: ok" in r.stdout


def test_judge_reads_each_kind_of_reply() -> None:
    by_id = {q.id: q for q in QUESTIONS}
    assert judge(by_id["mul"], "6 times 7 = 42.", []) == (True, "42")
    assert judge(by_id["mul"], "The answer is 48", [])[0] is False
    assert judge(by_id["print-upper"], "```\nHI\n```", []) == (True, "HI")
    assert judge(by_id["week"], "There are seven days in a week.", [])[0] is True
    assert judge(by_id["add-tool"], "", [("add_numbers", '{"a": 3, "b": 4}')])[0] is True
    assert judge(by_id["add-tool"], "", [("add_numbers", '{"a": 4, "b": 3}')])[0] is False
    with pytest.raises(ValueError):
        judge(Question("x", "facts", "?", "y", "nope"), "y", [])


@pytest.mark.timeout(300)
def test_eval_runs_the_embedded_set_and_is_stable(tmp_path: Path) -> None:
    first, again = tmp_path / "first.json", tmp_path / "again.json"
    r = ds4d("--threads", "2", "--json", str(first))
    assert r.returncode == 0, r.stderr
    lines = r.stdout.splitlines()
    assert len([ln for ln in lines if re.match(r"(PASS|FAIL)  ", ln)]) == len(QUESTIONS)
    summary = re.search(r"score (\d+)/(\d+) \([\d.]+%\): arithmetic \d+/6, code \d+/6, "
                        r"facts \d+/6, tools \d+/4;", lines[-1])  # fmt: skip
    assert summary and int(summary.group(2)) == len(QUESTIONS), lines[-1]
    doc = json.loads(first.read_text())
    assert doc["passed"] == int(summary.group(1)) and len(doc["results"]) == len(QUESTIONS)
    # the embedded model's baseline (docs/eval.md): it knows its facts
    assert all(x["ok"] for x in doc["results"] if x["kind"] == "facts")
    r = ds4d("--threads", "2", "--kind", "arithmetic", "--kind", "facts", "--json", str(again))
    assert r.returncode == 0, r.stderr
    replies = {x["id"]: x["reply"] for x in doc["results"]}
    for x in json.loads(again.read_text())["results"]:
        assert x["reply"] == replies[x["id"]], x["id"]
