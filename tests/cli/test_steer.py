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


@pytest.mark.timeout(600)
def test_serve_applies_the_control_vector_to_every_slot(tmp_path: Path, vector: Path) -> None:
    """`ds4d serve --control-vector-scaled FILE:SCALE`: a greedy reply over HTTP (the real
    openai client) is the in-process engine's reply under the same steering, and not the
    unsteered one."""
    import tempfile

    import openai

    from ds4d.chat.local import LocalChat
    from ds4d.chat.types import ChatRequest, Message, Sampling
    from ds4d.engine import Engine
    from ds4d.engine.default_model import default_model_path
    from ds4d.engine.steering import load_control_vectors
    from ds4d.tools.serve_process import private_env, serve_process

    question = "What is a glacier?"
    want = {}
    with Engine.open(default_model_path(), threads=2) as engine:
        for scale in (0.0, -0.5):
            engine.set_steering(load_control_vectors(
                [(vector, scale)], engine.info.n_layer, engine.info.n_embd))  # fmt: skip
            chat = LocalChat(engine, 2048)
            req = ChatRequest(messages=[Message("user", question)], max_tokens=60,
                              sampling=Sampling(temperature=0.0))  # fmt: skip
            want[scale] = chat.generate(req).text
            chat.close()
    assert want[0.0] != want[-0.5]
    with tempfile.TemporaryDirectory(prefix="ds4s") as short:
        dirs = {var: Path(short) / var.lower() for var in
                ("XDG_CONFIG_HOME", "XDG_STATE_HOME", "XDG_CACHE_HOME", "XDG_RUNTIME_DIR")}  # fmt: skip
        args = ["--threads", "2", "--ctx", "2048", "--slots", "2", "--no-kv-disk",
                "--control-vector-scaled", f"{vector}:-0.5"]  # fmt: skip
        with serve_process(args, env=private_env(dirs), log_path=tmp_path / "serve.log",
                           start_timeout=120) as server:  # fmt: skip
            client = openai.OpenAI(base_url=server.url + "/v1", api_key="x")
            for _ in range(2):  # a fresh slot, then a reused prefix: both steered
                r = client.chat.completions.create(
                    model="m", messages=[{"role": "user", "content": question}],
                    max_tokens=60, temperature=0.0,
                )  # fmt: skip
                assert r.choices[0].message.content == want[-0.5]
        assert "steering: {'source': 'verbosity.gguf×-0.5'" in (tmp_path / "serve.log").read_text()
