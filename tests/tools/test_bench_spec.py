"""`ds4d bench spec` end to end: real `ds4d serve` processes (the embedded model, drafting
for itself), the three workloads, the CSV's rows; and what it refuses."""

from __future__ import annotations

import csv
import subprocess
import sys
from pathlib import Path

import pytest

from ds4d.cli.main import main
from ds4d.tools.bench_spec import CSV_FIELDS, workloads


def test_the_workloads_copy_the_file_and_start_its_copy(tmp_path: Path) -> None:
    source = tmp_path / "shapes.py"
    source.write_text("class Square:\n    side = 1\n\n\ndef area(s: Square) -> int:\n"
                      "    return s.side ** 2\n")  # fmt: skip
    w = workloads(source, "Square=Tile")
    assert w["rewrite"].count("class Square:") == 1  # the file, once
    assert w["rewrite"].endswith("renamed to Tile and nothing else changed\nclass Tile:\n")
    assert source.read_text() in w["edit"] and w["edit"].endswith('"old_string": "')
    assert "Square" not in w["prose"]


def test_an_unknown_workload_is_refused(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["bench", "spec", "--workloads", "poetry"]) == 2
    assert "unknown workload 'poetry'" in capsys.readouterr().err


def test_bench_spec_measures_off_lookup_and_draft(tmp_path: Path, model_path: Path) -> None:
    out = tmp_path / "spec.csv"
    done = subprocess.run(
        [sys.executable, "-m", "ds4d", "bench", "spec", "--draft-model", str(model_path),
         "--tokens", "24", "--rounds", "1", "--ctx", "2048", "--csv", str(out)],
        capture_output=True, text=True, timeout=600,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-2000:]
    with out.open() as f:
        rows = list(csv.DictReader(f))
    assert tuple(rows[0]) == CSV_FIELDS
    assert {(r["workload"], r["mode"]) for r in rows} == {
        (w, m) for w in ("rewrite", "edit", "prose") for m in ("off", "lookup", "draft")
    }
    for r in rows:
        assert r["server"] == "ds4d" and int(r["tokens"]) > 0 and float(r["tok_s"]) > 0
        assert r["same_text"] == "True"  # greedy: every mode writes the same text
        if r["mode"] == "off":
            assert int(r["drafted"]) == 0
    # How much each workload drafts is the cost rule's choice (ds4d.serving.stepcost: it
    # stops drafting once the measured costs say drafts do not pay, which depends on the
    # machine). Prompt lookup costs no draft pass, and the rewrite copies: it drafts. The
    # draft model here is the target itself, a pass as slow as a step: the rule may stop
    # it in the warm-up request before any measured one, so whether it drafts is not
    # asserted (tests/serving/test_speculation_draft.py drafts with the rule off).
    assert any(int(r["drafted"]) > 0 for r in rows if r["mode"] == "lookup")
    draft = [r for r in rows if r["mode"] == "draft"]
    assert all(int(r["accepted"]) >= 0.9 * int(r["drafted"]) for r in draft)
