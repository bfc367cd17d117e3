"""The decode and prefill profiles and their bounds: the native timers (ds4n_profile_*), the
read bandwidth measure, the compute peak probe (ds4n_mac_peak), the per-token splits of
`ds4d bench --profile`, and both CLI modes."""

from __future__ import annotations

import csv
import math
from pathlib import Path

import numpy as np
import pytest

from ds4d.engine import Engine, EngineError, native
from ds4d.engine.engine import PREFILL_CHUNK
from ds4d.tools.bench_profile import kv_bytes_read, model_peaks, profile_decode, profile_prefill
from tests.cli.test_commands import ds4d
from tests.helpers.kit import kit_model
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
    # The tokens multiplied: T of each call, summed (what the prefill profile's MACs count).
    assert got["Q4_1", 0, 64, 256].tokens == 3 and got["Q8_0", 1, 96, 256].tokens == 5
    assert got["Q8_0", 0, 96, 256].tokens == 1
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


# The products per weight multiply-add of each type's prefill kernel at each precision: f32
# FMA on the exact path, the block format's int8 limbs, the super-block format's int16 limbs
# (native/quants_int.h); F16 has no integer kernel and stays exact.
PEAK_PRODUCTS = {
    "exact": {"Q4_1": 1, "Q8_0": 1, "Q4_K": 1, "Q6_K": 1, "F16": 1},
    "int2": {"Q4_1": 2, "Q8_0": 2, "Q4_K": 1, "Q6_K": 1, "F16": 1},
    "int3": {"Q4_1": 3, "Q8_0": 3, "Q4_K": 2, "Q6_K": 2, "F16": 1},
}


def has_probe() -> bool:
    """Whether the level in force has a kernel of its own for the path, so a probe: every
    level but the scalar one (x86 and NEON have their own float and integer kernels)."""
    return native.simd_level() != native.SIMD_SCALAR


@pytest.mark.parametrize("precision", list(native.PRECISIONS))
def test_mac_peak_is_measured_for_each_precision(precision: str) -> None:
    for qtype, products in PEAK_PRODUCTS[precision].items():
        peak = native.mac_peak(qtype, precision, threads=2, iters=100_000, reps=2)
        assert peak.products == products, qtype
        if not has_probe():
            assert peak.instr == "" and peak.per_core == 0.0
            continue
        # A real core: positive and finite, far below 10^13 multiply-adds per second.
        assert peak.instr and 1e8 < peak.lane_rate < 1e13 and math.isfinite(peak.lane_rate)
        assert peak.per_core == pytest.approx(peak.lane_rate / products)
        assert peak.rate == pytest.approx(2 * peak.per_core)
        if precision == "exact" or qtype == "F16":
            assert "FMADD" in peak.instr or "FMLA" in peak.instr
    with pytest.raises(ValueError):
        native.mac_peak("Q4_1", "int4")
    with pytest.raises(ValueError):
        native.mac_peak("Q4_1", precision, iters=0)


def test_mac_peak_has_no_probe_on_the_scalar_level() -> None:
    try:
        assert native.set_simd("scalar") == native.SIMD_SCALAR
        for precision in native.PRECISIONS:
            peak = native.mac_peak("Q4_K", precision, iters=1000)
            assert peak.instr == "" and peak.lane_rate == 0.0 and peak.rate == 0.0
    finally:
        native.set_simd(native.SIMD_AUTO)


def _matmul_macs(gf, n_vocab: int) -> tuple[dict[str, int], tuple[str, int]]:
    """From the file's tensor shapes alone: each type's multiply-adds per token over the
    layers' matrices (every one multiplies each token once), and the output head's type and
    multiply-adds for one token (its own tensor, or the tied embedding)."""
    layers: dict[str, int] = {}
    for name in gf.tensor_names():
        t = gf.tensor(name)
        if name.startswith("blk.") and len(t.shape) == 2:
            layers[t.type_name] = layers.get(t.type_name, 0) + t.shape[0] * t.shape[1]
    names = set(gf.tensor_names())
    head = gf.tensor("output.weight" if "output.weight" in names else "token_embd.weight")
    assert head.shape[1] == n_vocab
    return layers, (head.type_name, head.shape[0] * head.shape[1])


def _check_prefill_split(engine: Engine) -> None:
    session = engine.new_session(PREFILL_CHUNK + 200)
    session.eval(engine.tokenizer.encode("Quel ramo del lago di Como, " * 4, special=False))
    start = session.n_tokens
    tokens = [int(t) for t in np.arange(PREFILL_CHUNK + 60) % 500 + 100]  # two chunks
    peaks = model_peaks(engine)
    parts, pool = profile_prefill(engine, session, tokens, peaks)
    assert session.n_tokens == start + len(tokens)
    session.close()
    assert all(p.phase == "prefill" and p.ctx == start + len(tokens) for p in parts)
    by = {p.part: p for p in parts}
    token = by.pop("token")
    # The parts are the measured wall time, whole.
    assert sum(p.ms_per_token for p in by.values()) == pytest.approx(token.ms_per_token)
    assert {"attention", "pool sync", "native serial", "python"} < set(by)
    assert all(p.ms_per_token > 0 for name, p in by.items() if name != "python")
    # The multiply-adds are the tensors': each layer matrix once per token, the head once per
    # chunk (the last token's logits).
    layers, (head_type, head_macs) = _matmul_macs(engine.gguf, engine.info.n_vocab)
    got = {name.removeprefix("matmul "): p.macs_per_token for name, p in by.items()
           if name.startswith("matmul ")}  # fmt: skip
    assert got == layers
    assert by[f"output head {head_type}"].macs_per_token == round(2 * head_macs / len(tokens))
    assert token.macs_per_token == pytest.approx(sum(p.macs_per_token for p in by.values()), abs=1)
    for name, p in by.items():
        if name.startswith(("matmul", "output head")):
            # (macs_per_token is rounded to an integer: the head's is a chunk's over its tokens)
            assert p.gmac_per_s == pytest.approx(p.macs_per_token / p.ms_per_token / 1e6, rel=1e-3)
            qtype = name.rsplit(" ", 1)[1]
            peak = peaks[native.TYPES[qtype]]
            if not has_probe():  # nothing to hold it against
                assert p.fraction_of_peak == 0
                continue
            # Below the peak of the instruction its kernel runs (the peak ignores the rest).
            assert 0 < p.fraction_of_peak < 1, name
            seconds = p.macs_per_token * len(tokens) / peak.rate
            taken = p.ms_per_token * len(tokens) / 1e3
            assert p.fraction_of_peak == pytest.approx(seconds / taken, rel=1e-3)
            assert peak.threads == engine.threads
        else:
            assert p.macs_per_token == 0 and p.fraction_of_peak == 0
    assert 0 < token.fraction_of_peak < 1 if has_probe() else token.fraction_of_peak == 0
    assert pool.dispatches_per_token > engine.info.n_layer  # per chunk: at least one per layer


@pytest.mark.parametrize("precision", ["exact", "int2"])
def test_profile_prefill_splits_the_prompt_and_counts_the_macs(model_path, precision: str) -> None:
    with Engine.open(model_path, threads=2, precision=precision) as engine:
        _check_prefill_split(engine)


@pytest.mark.parametrize("family", ["qwen3", "phi3"])
def test_profile_prefill_counts_a_kit_models_macs(family: str) -> None:
    with Engine.open(kit_model(family), threads=2) as engine:
        _check_prefill_split(engine)


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
    assert {x["phase"] for x in rows} == {"decode", "prefill"}
    expected = {
        "decode": {"matvec Q4_1", "output head Q8_0", "attention", "pool sync",
                   "native serial", "sampling", "python", "token"},
        "prefill": {"matmul Q4_1", "output head Q8_0", "attention", "pool sync",
                    "native serial", "python", "token"},
    }  # fmt: skip
    for ctx in (64, 128):
        for phase, names in expected.items():
            mine = {x["part"]: x for x in rows if int(x["ctx"]) == ctx and x["phase"] == phase}
            assert names == set(mine)
            total = sum(float(x["ms_per_token"]) for p, x in mine.items() if p != "token")
            assert total == pytest.approx(float(mine["token"]["ms_per_token"]), rel=1e-3)
        prefill = {x["part"]: x for x in rows if int(x["ctx"]) == ctx and x["phase"] == "prefill"}
        assert int(prefill["matmul Q4_1"]["macs_per_token"]) > 0
        assert 0 < float(prefill["matmul Q4_1"]["fraction_of_peak"]) < 1
        assert float(prefill["matmul Q4_1"]["gmac_per_s"]) > 0
    assert out_png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert "of bound" in r.stdout and "of peak" in r.stdout and "# compute peak Q4_1" in r.stdout


def test_bench_without_prompt_file_is_a_clear_error() -> None:
    r = ds4d("bench", "--ctx-start", "64", timeout=60)
    assert r.returncode == 2 and "--prompt-file" in r.stderr and "Traceback" not in r.stderr
