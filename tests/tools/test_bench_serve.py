"""`ds4d bench serve`: the workload is a function of the seed, and a run against a real
daemon (started by the bench, or already running) reports numbers that agree with what
the server itself counted."""

from __future__ import annotations

import csv
import json
import sys
from pathlib import Path

import pytest

from ds4d.tools.bench_serve import (
    CSV_FIELDS,
    Row,
    Shape,
    build_workload,
    chat_messages,
    percentile,
    write_csv,
)
from tests.cli.test_commands import ds4d
from tests.e2e.daemon_process import running_daemon

TEXT = Path(__file__).parents[1] / "data" / "text" / "promessi_sposi.txt"

# Small enough for a fast test on a loaded 2-core machine, large enough for several
# streamed tokens per answer and a history that grows.
TINY = ("--turns", "2", "--max-tokens", "8", "--first-words", "30", "--long-words", "60",
        "--turn-words", "16", "--reply-words", "8")  # fmt: skip
TINY_SHAPE = Shape(turns=2, max_tokens=8, first_words=30, long_words=60, turn_words=16,
                   reply_words=8, stream_share=0.7)  # fmt: skip


def words() -> list[str]:
    return TEXT.read_text(encoding="utf-8").split()


def read_csv(path: Path) -> tuple[list[str], list[dict[str, str]]]:
    with path.open(newline="") as f:
        reader = csv.DictReader(f)
        return list(reader.fieldnames or ()), list(reader)


def read_log(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines()]


# --- the workload ---------------------------------------------------------------------


def test_workload_is_a_function_of_the_seed() -> None:
    shape = Shape(4, 64, 150, 1000, 60, 30, 0.7)
    w = words()
    assert build_workload(w, 7, 4, shape) == build_workload(w, 7, 4, shape)
    assert build_workload(w, 7, 4, shape) != build_workload(w, 8, 4, shape)


def test_conversations_keep_their_shape_across_k_but_not_their_text() -> None:
    shape = Shape(4, 64, 150, 1000, 60, 30, 0.5)
    w = words()
    at2, at4 = build_workload(w, 3, 2, shape), build_workload(w, 3, 4, shape)
    assert len(at2) == 2 and len(at4) == 4
    for a, b in zip(at2, at4[:2], strict=True):
        assert [len(t.user.split()) for t in a.turns] == [len(t.user.split()) for t in b.turns]
        assert [len(t.reply.split()) for t in a.turns] == [len(t.reply.split()) for t in b.turns]
        assert [t.stream for t in a.turns] == [t.stream for t in b.turns]
        # another K's run must not find this one's prompts cached
        assert a.system != b.system and a.turns[0].user != b.turns[0].user


def test_first_conversation_has_the_long_prompt_and_every_first_turn_streams() -> None:
    shape = Shape(6, 64, 150, 1000, 60, 30, 0.5)
    convs = build_workload(words(), 1, 4, shape)
    first_words = [len(c.turns[0].user.split()) for c in convs]
    assert first_words[0] > 1000 and max(first_words[1:]) < 300
    assert all(c.turns[0].stream for c in convs)
    later = [t.stream for c in convs for t in c.turns[1:]]
    assert any(later) and not all(later)  # some streamed, some not


def test_history_grows_by_whole_turns() -> None:
    conv = build_workload(words(), 1, 1, Shape(3, 64, 150, 100, 60, 30, 0.7))[0]
    replies = [t.reply for t in conv.turns]
    m2, m3 = chat_messages(conv, 1, replies[:1]), chat_messages(conv, 2, replies[:2])
    assert m3[: len(m2)] == m2  # each prompt extends the previous one
    assert [m["role"] for m in m3] == ["user", "assistant", "user", "assistant", "user"]
    assert m3[1]["content"] == replies[0] and m3[-1]["content"] == conv.turns[2].user


def test_percentile_interpolates() -> None:
    assert percentile([], 50) is None
    assert percentile([3.0], 95) == 3.0
    assert percentile([4.0, 1.0, 3.0, 2.0], 50) == 2.5
    assert percentile([float(x) for x in range(101)], 95) == pytest.approx(95.0)


def test_csv_keeps_the_rows_of_other_labels(tmp_path: Path) -> None:
    def row(label: str, k: int, tps: float) -> Row:
        return Row(label, "openai", k, 4, 3, 0, 2.0, 100, None, 40, None, tps,
                   0.5, 0.9, 0.02, 0.05, 1.5)  # fmt: skip

    path = tmp_path / "serve.csv"
    write_csv(path, [row("ds4d", 1, 20.0), row("ds4d", 2, 30.0)])
    write_csv(path, [row("llama-server", 1, 25.0)])
    write_csv(path, [row("ds4d", 1, 21.0)])  # a new ds4d series replaces the old one
    fields, rows = read_csv(path)
    assert tuple(fields) == CSV_FIELDS
    assert [(r["label"], r["clients"], r["gen_tps"]) for r in rows] == [
        ("llama-server", "1", "25.0000"),
        ("ds4d", "1", "21.0000"),
    ]
    assert rows[0]["cached_tokens"] == "" and rows[0]["server_completion_tokens"] == ""


# --- against a real daemon ------------------------------------------------------------


def check_run(row: dict[str, str], log: list[dict], clients: int, shape: Shape) -> None:
    """The CSV row agrees with the requests behind it and with the server's own count."""
    convs = build_workload(words(), 1, clients, shape)
    assert int(row["clients"]) == clients
    assert int(row["requests"]) == len(log) == clients * shape.turns
    assert int(row["errors"]) == 0 and all(r["error"] == "" for r in log)
    assert int(row["streamed"]) == sum(t.stream for c in convs for t in c.turns)
    completion = sum(r["completion_tokens"] for r in log)
    assert completion > 0 and int(row["completion_tokens"]) == completion
    # the usage every answer reported adds up to what the server counted it generated
    assert int(row["server_completion_tokens"]) == completion
    assert int(row["prompt_tokens"]) == sum(r["prompt_tokens"] for r in log)
    assert int(row["cached_tokens"]) == sum(r["cached_tokens"] for r in log)
    wall = float(row["wall_s"])
    assert wall > 0 and float(row["gen_tps"]) == pytest.approx(completion / wall, rel=1e-3)
    assert 0 < float(row["ttft_p50_s"]) <= float(row["ttft_p95_s"]) <= wall
    assert 0 < float(row["itl_p50_s"]) <= float(row["itl_p95_s"]) <= float(row["itl_p99_s"])
    gaps = [g for r in log for g in r["gaps_s"]]
    assert float(row["itl_max_s"]) == pytest.approx(max(gaps), abs=1e-4)
    assert 0 < float(row["latency_p95_s"]) <= wall
    for r in log:
        assert 1 <= r["completion_tokens"] <= shape.max_tokens and r["text"]
        assert 0 <= r["cached_tokens"] < r["prompt_tokens"]
        assert 0 <= r["start_s"] and r["start_s"] + r["latency_s"] <= wall + 1e-3
        if r["stream"]:
            # each streamed text event is at least one generated token
            assert 1 <= r["chunks"] <= r["completion_tokens"]
            assert len(r["gaps_s"]) == r["chunks"] - 1
            assert 0 < r["ttft_s"] <= r["latency_s"]
        else:
            assert r["chunks"] == 0 and r["ttft_s"] is None
    for c in range(clients):
        turns = sorted((r for r in log if r["conversation"] == c), key=lambda r: r["turn"])
        assert [r["turn"] for r in turns] == list(range(shape.turns))
        prompts = [r["prompt_tokens"] for r in turns]
        assert prompts == sorted(prompts) and len(set(prompts)) == len(prompts)  # it grows


def test_start_runs_k_clients_against_a_real_daemon(tmp_path: Path) -> None:
    out_csv, out_png, out_log = tmp_path / "s.csv", tmp_path / "s.png", tmp_path / "s.jsonl"
    # --serve-python: the daemon runs under the interpreter given (here one that says it
    # ran, then is this venv's), as another checkout's would
    python, ran = tmp_path / "python", tmp_path / "ran"
    python.write_text(f'#!/bin/sh\necho "$@" > {ran}\nexec {sys.executable} "$@"\n')
    python.chmod(0o755)
    r = ds4d("bench", "serve", "--start", "--serve-python", str(python), "--clients", "2",
             *TINY, "--csv", str(out_csv), "--plot", str(out_png), "--requests-log",
             str(out_log), "--", "--slots", "2", "--threads", "2", "--no-kv-disk")  # fmt: skip
    assert r.returncode == 0, r.stderr
    assert ran.read_text().startswith("-m ds4d serve ")
    fields, rows = read_csv(out_csv)
    assert tuple(fields) == CSV_FIELDS
    assert [(x["label"], x["api"]) for x in rows] == [("ds4d", "openai")]
    check_run(rows[0], read_log(out_log), 2, TINY_SHAPE)
    assert out_png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert "starting:" in r.stdout and "ds4d" in r.stdout


def test_url_anthropic_with_generated_replies_reuses_each_turn(tmp_path: Path) -> None:
    out_csv, out_log = tmp_path / "a.csv", tmp_path / "a.jsonl"
    with running_daemon(tmp_path, "--slots", "2", "--threads", "2") as daemon:
        r = ds4d("bench", "serve", "--url", daemon.url, "--api", "anthropic", "--label", "anth",
                 "--clients", "1", *TINY, "--replies", "generated", "--stream-share", "0",
                 "--csv", str(out_csv), "--requests-log", str(out_log))  # fmt: skip
    assert r.returncode == 0, r.stderr
    _, rows = read_csv(out_csv)
    assert [(x["label"], x["api"]) for x in rows] == [("anth", "anthropic")]
    log = read_log(out_log)
    check_run(rows[0], log, 1, Shape(**{**TINY_SHAPE.__dict__, "stream_share": 0.0}))
    first, second = log
    # the history carries the server's own answer, so the second turn's prompt extends
    # everything the slot holds (prompt and answer) and reuses all of the first prompt
    assert second["cached_tokens"] >= first["prompt_tokens"]
    assert second["stream"] is False and first["stream"] is True


def test_bad_arguments_are_one_line_errors(tmp_path: Path) -> None:
    r = ds4d("bench", "serve", "--url", "http://127.0.0.1:9", "--clients", "0")
    assert r.returncode == 2 and "--clients" in r.stderr and "Traceback" not in r.stderr
    r = ds4d("bench", "serve", "--url", "http://127.0.0.1:9", "--", "--slots", "4")
    assert r.returncode == 2 and "--start" in r.stderr
    r = ds4d("bench", "serve", "--url", "http://127.0.0.1:9", "--serve-python", "python3")
    assert r.returncode == 2 and "--serve-python needs --start" in r.stderr
    missing = tmp_path / "no-such-python"
    r = ds4d("bench", "serve", "--start", "--serve-python", str(missing), "--turns", "1")
    assert r.returncode == 1 and f"cannot run {missing}" in r.stderr
    assert "Traceback" not in r.stderr
    r = ds4d("bench", "serve", "--url", "http://127.0.0.1:9", "--turns", "1")  # no server
    assert r.returncode == 1 and r.stderr.startswith("ds4d: http://127.0.0.1:9/v1/chat")
    assert "Traceback" not in r.stderr
