"""The decode profile and the bandwidth bound: the native timers (ds4n_profile_*), the read
bandwidth measure, the per-token split of `ds4d bench --profile`, and both CLI modes."""

from __future__ import annotations

import csv
from pathlib import Path

import numpy as np
import pytest

from ds4d.engine import EngineError, native
from ds4d.tools.bench_profile import kv_bytes_read, profile_decode
from tests.cli.test_commands import ds4d
from tests.native.test_kernels import random_weights


@pytest.fixture
def profile():
    native.Profile.enable()
    yield native.Profile
    native.Profile.disable()


def test_read_bandwidth_is_measured() -> None:
    with native.Pool(2) as pool:
        for huge_pages in (True, False):
            bw = native.read_bandwidth(pool, 8 << 20, reps=2, huge_pages=huge_pages)
            # bytes/s: a real memory system, not a zero page or a clock glitch
            assert 1e8 < bw < 1e13
    with native.Pool(1) as pool, pytest.raises(EngineError):
        native.read_bandwidth(pool, 100)


@pytest.mark.parametrize("threads", [1, 2])
def test_profile_times_each_matmul_shape(profile, threads: int) -> None:
    rng = np.random.default_rng(0)
    a, b = random_weights("Q4_1", 64, 256, rng), random_weights("Q8_0", 96, 256, rng)
    x = rng.standard_normal((1, 256)).astype(np.float32)
    x5 = rng.standard_normal((5, 256)).astype(np.float32)
    calls = []
    other = native.POOL_FN(lambda ctx, ith, nth: calls.append(ith))
    with native.Pool(threads) as pool:
        for _ in range(3):
            native.matmul(pool, "Q4_1", a, 64, 256, x)
        native.matmul(pool, "Q8_0", b, 96, 256, x)
        native.matmul(pool, "Q8_0", b, 96, 256, x5)
        native.lib.ds4n_pool_run(pool.handle, other, None)
        profile.mark()
        entries, totals = profile.read()
    assert len(calls) == threads
    got = {(native.TYPES_BY_ID[e.type], e.prefill, e.rows, e.K): e for e in entries}
    assert set(got) == {("Q4_1", 0, 64, 256), ("Q8_0", 0, 96, 256), ("Q8_0", 1, 96, 256)}
    assert got["Q4_1", 0, 64, 256].calls == 3 and got["Q4_1", 0, 64, 256].parts == 3 * threads
    assert got["Q8_0", 1, 96, 256].calls == 1
    assert all(e.wall_ns > 0 and e.busy_ns > 0 for e in entries)
    assert totals["dispatches"] == 6 and totals["passes"] == 1
    # The dispatches' wall time is divided, whole, among the matmuls, the other work and the
    # synchronisation beyond the busiest thread's work.
    shared = sum(e.wall_ns for e in entries) + totals["other_wall_ns"] + totals["sync_ns"]
    assert abs(shared - totals["wall_ns"]) <= 2 * totals["dispatches"]
    assert 0 <= totals["sync_ns"] < totals["wall_ns"]
    assert totals["other_busy_ns"] > 0
    assert totals["span_ns"] >= totals["wall_ns"] > 0
    # Every worker either joined a dispatch (and its delay was timed) or ran no share of it.
    assert totals["joins"] + totals["absent"] == (threads - 1) * totals["dispatches"]
    assert totals["join_ns"] >= 0 and (totals["joins"] > 0 or totals["join_ns"] == 0)


def test_profile_off_records_nothing() -> None:
    rng = np.random.default_rng(1)
    w = random_weights("Q4_1", 16, 64, rng)
    x = rng.standard_normal((1, 64)).astype(np.float32)
    native.Profile.enable()
    native.Profile.disable()
    with native.Pool(2) as pool:
        native.matmul(pool, "Q4_1", w, 16, 64, x)
    native.Profile.mark()
    entries, totals = native.Profile.read()
    assert entries == [] and all(v == 0 for v in totals.values())


def test_profile_decode_splits_the_whole_token(engine) -> None:
    session = engine.new_session(200)
    session.eval(engine.tokenizer.encode("Quel ramo del lago di Como, " * 8, special=False))
    ctx = session.n_tokens
    stop = np.fromiter(engine.tokenizer.eog_ids, dtype=np.int64)
    parts, pool = profile_decode(engine, session, 6, stop, bandwidth=20e9)
    assert session.n_tokens == ctx + 6
    by = {p.part: p for p in parts}
    token = by.pop("token")
    assert sum(p.ms_per_token for p in by.values()) == pytest.approx(token.ms_per_token)
    assert all(p.ms_per_token > 0 for name, p in by.items() if name != "python")
    # Every weight matrix is read once per token: the parts' bytes are the file's tensors.
    gf = engine.gguf
    q4 = sum(gf.tensor(n).n_bytes for n in gf.tensor_names()
             if n.startswith("blk.") and gf.tensor(n).type_name == "Q4_1")  # fmt: skip
    assert by["matvec Q4_1"].bytes_per_token == q4
    assert by["output head Q8_0"].bytes_per_token == gf.tensor("token_embd.weight").n_bytes
    kv = kv_bytes_read(engine.model, ctx + 3, engine.kv_type)  # in the stored KV type
    assert by["attention"].bytes_per_token == kv > 0
    assert 0 < token.fraction_of_bound < 1
    assert "pool sync" in by
    # A llama layer is 5 dispatches (q/k/v, attention, o, gate/up, down), plus the head.
    assert pool.dispatches_per_token == 5 * engine.info.n_layer + 1
    assert 0.0 <= pool.absent <= 1.0 and pool.join_us >= 0.0
    session.close()


def test_bench_bandwidth_cli() -> None:
    r = ds4d("bench", "--bandwidth", "--bandwidth-mib", "16", "--threads", "2", timeout=120)
    assert r.returncode == 0, r.stderr
    assert r.stdout.startswith("read bandwidth: ") and "on huge pages" in r.stdout
    assert "GB/s on 4 KB pages (2 threads, 16 MiB buffer" in r.stdout


def test_bench_profile_cli_writes_csv_and_plot(tmp_path: Path) -> None:
    prompt = tmp_path / "prompt.txt"
    prompt.write_text("Quel ramo del lago di Como, che volge a mezzogiorno. " * 40)
    out_csv, out_png = tmp_path / "p.csv", tmp_path / "p.png"
    r = ds4d("bench", "--prompt-file", str(prompt), "--ctx-start", "64", "--ctx-max", "128",
             "--step-incr", "64", "--gen-tokens", "3", "--threads", "2", "--bandwidth-mib", "16",
             "--profile-csv", str(out_csv), "--profile-plot", str(out_png))  # fmt: skip
    assert r.returncode == 0, r.stderr
    rows = list(csv.DictReader(out_csv.open()))
    assert {int(x["ctx"]) for x in rows} == {64, 128}
    for ctx in (64, 128):
        mine = {x["part"]: x for x in rows if int(x["ctx"]) == ctx}
        assert {"matvec Q4_1", "output head Q8_0", "attention", "pool sync", "native serial",
                "sampling", "python", "token"} == set(mine)  # fmt: skip
        total = sum(float(x["ms_per_token"]) for p, x in mine.items() if p != "token")
        assert total == pytest.approx(float(mine["token"]["ms_per_token"]), rel=1e-3)
    assert out_png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert "of bound" in r.stdout


def test_bench_without_prompt_file_is_a_clear_error() -> None:
    r = ds4d("bench", "--ctx-start", "64", timeout=60)
    assert r.returncode == 2 and "--prompt-file" in r.stderr and "Traceback" not in r.stderr
