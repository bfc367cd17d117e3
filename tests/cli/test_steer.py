"""`ds4d steer build` and the steering flags of `ds4d generate`, as a user runs them (real
processes, the embedded model, the demo's prompt sets in tests/data/steering)."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from ds4d.engine.steering import read_control_vector
from tests.conftest import DATA, REPO

SETS = DATA / "steering"


def ds4d(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "ds4d", *args],
        cwd=REPO, env=dict(os.environ, PYTHONUNBUFFERED="1"),
        capture_output=True, text=True, timeout=600,
    )  # fmt: skip


@pytest.fixture(scope="module")
def vector(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("steer") / "verbosity.gguf"
    r = ds4d("steer", "build", "--positive", str(SETS / "verbose.txt"), "--negative",
             str(SETS / "terse.txt"), "--layers", "4:12", "-o", str(out), "--threads", "2")  # fmt: skip
    assert r.returncode == 0, r.stderr
    return out


def generated_tokens(*args: str) -> tuple[str, int]:
    r = ds4d("generate", "--threads", "2", "-n", "80", *args)
    assert r.returncode == 0, r.stderr
    m = re.search(r"(\d+) generated", r.stderr)
    assert m, r.stderr
    return r.stdout, int(m.group(1))


def test_build_writes_the_asked_layers(vector: Path) -> None:
    dirs = read_control_vector(vector)
    assert sorted(dirs) == list(range(4, 13))
    assert all(len(v) == 576 and np.linalg.norm(v) > 0 for v in dirs.values())
    r = ds4d("steer", "show", str(vector))
    assert r.returncode == 0 and r.stdout.splitlines()[0].startswith("direction.4: 576 values")


def test_the_direction_moves_answer_length_and_scale_zero_changes_nothing(vector: Path) -> None:
    prompts = ["What is a rainbow?", "How do bees make honey?", "What is a glacier?"]
    shorter = longer = 0
    for p in prompts:
        plain, n_plain = generated_tokens("-p", p)
        zero, _ = generated_tokens("-p", p, "--control-vector-scaled", str(vector), "0")
        assert zero == plain  # scale 0: the unsteered forward pass, bit for bit
        _, n_neg = generated_tokens("-p", p, "--control-vector-scaled", str(vector), "-0.5")
        _, n_pos = generated_tokens("-p", p, "--control-vector-scaled", str(vector), "0.5",
                                    "--directional-steering-attn", "0.0")  # fmt: skip
        shorter += n_neg
        longer += n_pos
    assert shorter < longer, (shorter, longer)


def test_bad_steering_arguments_are_refused(tmp_path: Path, vector: Path) -> None:
    r = ds4d("steer", "build", "--positive", str(SETS / "verbose.txt"), "--negative",
             str(tmp_path / "none.txt"), "-o", str(tmp_path / "o.gguf"))  # fmt: skip
    assert r.returncode == 2 and "cannot read" in r.stderr
    r = ds4d("steer", "build", "--positive", str(SETS / "verbose.txt"), "--negative",
             str(SETS / "terse.txt"), "--layers", "0:40", "-o", str(tmp_path / "o.gguf"))  # fmt: skip
    assert r.returncode == 2 and "--layers" in r.stderr
    not_a_vector = tmp_path / "x.gguf"
    not_a_vector.write_bytes(b"GGUF junk")
    r = ds4d("generate", "-p", "hi", "--control-vector", str(not_a_vector))
    assert r.returncode == 2 and "control vector" in r.stderr and "Traceback" not in r.stderr
