"""`ds4d bench` and `ds4d generate` as a user runs them: real processes, the real model."""

from __future__ import annotations

import csv
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import REPO


def ds4d(*args: str, timeout: float = 240) -> subprocess.CompletedProcess:
    env = dict(os.environ, PYTHONUNBUFFERED="1")
    return subprocess.run(
        [sys.executable, "-m", "ds4d", *args],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=timeout,
    )


def test_bench_writes_csv_and_plot(tmp_path: Path) -> None:
    prompt = tmp_path / "prompt.txt"
    prompt.write_text("Quel ramo del lago di Como, che volge a mezzogiorno. " * 40)
    out_csv, out_png = tmp_path / "b.csv", tmp_path / "b.png"
    r = ds4d(
        "bench",
        "--prompt-file",
        str(prompt),
        "--ctx-start",
        "64",
        "--ctx-max",
        "192",
        "--step-incr",
        "64",
        "--gen-tokens",
        "4",
        "--threads",
        "2",
        "--csv",
        str(out_csv),
        "--plot",
        str(out_png),
    )
    assert r.returncode == 0, r.stderr
    rows = list(csv.DictReader(out_csv.open()))
    assert [int(x["ctx"]) for x in rows] == [64, 128, 192]
    assert all(int(x["prefill_tokens"]) == 64 for x in rows)
    for x in rows:
        assert float(x["prefill_tps"]) > 0 and float(x["gen_tps"]) > 0
    # KV grows with the frontier: it is sized by held tokens or by n_ctx, never shrinking.
    kv = [int(x["kv_bytes"]) for x in rows]
    assert kv[0] > 0 and kv == sorted(kv)
    assert out_png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_bench_rejects_bad_sweep(tmp_path: Path) -> None:
    r = ds4d(
        "bench",
        "--prompt-file",
        str(tmp_path / "missing.txt"),
        "--ctx-start",
        "256",
        "--ctx-max",
        "128",
    )
    assert r.returncode == 2
    assert "ctx-max" in r.stderr and "Traceback" not in r.stderr


def test_generate_greedy_follows_exact_argmax(data_dir: Path, engine) -> None:
    """Greedy generation's first token is the exact-math argmax of the vector's first step."""
    case = json.loads((data_dir / "vectors/smollm2/chat_capital.json").read_text())
    exact = json.loads((data_dir / "vectors/smollm2/chat_capital.exact.json").read_text())
    first_id = exact["steps"][0]["top"][0][0]
    first_text = engine.tokenizer.decode([first_id])
    assert "capital of France" in case["prompt"]
    r = ds4d("generate", "-p", "What is the capital of France?", "-n", "12", "--threads", "2")
    assert r.returncode == 0, r.stderr
    assert r.stdout.startswith(first_text.lstrip()) or r.stdout.startswith(first_text)
    assert "prompt tokens" in r.stderr


@pytest.mark.parametrize("content", [None, b"", b"GGUF\x03\x00\x00\x00", b"not a model at all"])
def test_generate_bad_model_file_is_one_clear_line(tmp_path: Path, content: bytes | None) -> None:
    path = tmp_path / "model.gguf"
    if content is not None:
        path.write_bytes(content)
    r = ds4d("generate", "-m", str(path), "-p", "hi", timeout=60)
    assert r.returncode != 0
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in r.stderr, r.stderr
    assert lines[0].startswith("ds4d: ")


def test_generate_truncated_model_is_one_clear_line(tmp_path: Path, model_path: Path) -> None:
    path = tmp_path / "truncated.gguf"
    with model_path.open("rb") as src:
        path.write_bytes(src.read(model_path.stat().st_size // 3))
    r = ds4d("generate", "-m", str(path), "-p", "hi", timeout=60)
    assert r.returncode != 0
    assert len(r.stderr.strip().splitlines()) == 1 and "Traceback" not in r.stderr, r.stderr
