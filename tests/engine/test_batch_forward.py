"""The batched forward pass (Engine.eval_batch over ds4n_<family>_eval_batch): several
sessions advanced by one native call give each session bitwise the logits it gets when the
same calls run on it alone, for every attention-decoder family of the kit and the embedded
SmolLM2: mixed token counts in one batch (decode rows beside prefill chunks), sessions
joining and leaving between steps, sliding windows (gemma3, gpt-oss) and gpt-oss's sinks
crossed, split-key attention on a long session beside short ones, phi3's long-context rope
beside the short one. A refused batch leaves every session as it was."""

from __future__ import annotations

import ctypes
import importlib
from collections.abc import Iterator

import numpy as np
import pytest

from ds4d.engine import Engine, EngineError, native
from ds4d.engine.decoder import MAX_BATCH
from ds4d.engine.engine import FAMILIES
from ds4d.engine.errors import ContextFullError
from ds4d.engine.gguf_file import GGUFFile
from ds4d.engine.moe_decoder import MoEDecoderModel
from ds4d.engine.native import lib
from tests.helpers.kit import kit_families, kit_model
from tests.native.test_kernels import LEVELS, SIMD_LEVELS

N_CTX = 512

# One schedule: each step maps a session name to how many new tokens it gets ("+" names
# join there). A new session's first step is its prompt; steps mix prompts, prefill chunks
# and decode tokens; B leaves for a step and comes back; C passes 256 keys (split-key
# attention) while the others are short; B crosses the kit's windows (32, 48).
SCHEDULE: list[dict[str, int]] = [
    {"A": 3, "B": 45, "C": 200},
    {"C": 100},
    {"A": 1, "B": 5, "C": 1},
    {"A": 1, "B": 1, "C": 1},
    {"D": 17, "A": 1, "C": 1},
    {"B": 1, "D": 1, "A": 3, "C": 1},
    *[{"A": 1, "B": 1, "C": 1, "D": 1}] * 4,
    {"D": 2, "B": 1},
    {"C": 1, "A": 1},
]
# The embedded model is larger: the same shape of schedule over shorter prompts.
SMALL_SCHEDULE: list[dict[str, int]] = [
    {"A": 3, "B": 21, "C": 9},
    {"A": 1, "B": 4, "C": 1},
    {"D": 6, "A": 1, "C": 1},
    {"B": 1, "D": 1, "A": 2, "C": 1},
    {"A": 1, "B": 1, "C": 1, "D": 1},
]


def run_batched(engine: Engine, schedule: list[dict[str, int]], seed: int):
    """Runs the schedule through eval_batch; returns each session's chunks and the logits
    after each of its chunks."""
    rng = np.random.default_rng(seed)
    n_vocab = engine.info.n_vocab
    sessions: dict = {}
    chunks: dict[str, list[list[int]]] = {}
    seen: dict[str, list[np.ndarray]] = {}
    try:
        for step in schedule:
            batch = []
            for name, n in step.items():
                if name not in sessions:
                    sessions[name] = engine.new_session(N_CTX)
                    chunks[name], seen[name] = [], []
                toks = rng.integers(0, n_vocab, n).tolist()
                chunks[name].append(toks)
                batch.append((sessions[name], toks))
            engine.eval_batch(batch)
            for name in step:
                seen[name].append(sessions[name].compute_logits().copy())
        for name, s in sessions.items():
            assert s.tokens == [t for c in chunks[name] for t in c]
    finally:
        for s in sessions.values():
            s.close()
    return chunks, seen


def assert_alone_equal(engine: Engine, chunks, seen) -> None:
    for name, calls in chunks.items():
        with engine.new_session(N_CTX) as alone:
            for i, toks in enumerate(calls):
                alone.eval(toks)
                np.testing.assert_array_equal(
                    alone.compute_logits(), seen[name][i], err_msg=f"session {name}, call {i}"
                )


@pytest.fixture(scope="module", params=kit_families())
def kit_engine(request) -> Iterator[Engine]:
    """The kit model in an Engine without its tokenizer (building a 262k-entry vocabulary
    costs more than these tests; sessions never need it)."""
    gf = GGUFFile(kit_model(request.param))
    family = importlib.import_module(FAMILIES[gf.architecture])
    pool = native.Pool(2)
    with Engine(gf, family, family.load(gf, pool), pool, tokenizer=None) as e:
        yield e


@pytest.fixture(params=LEVELS, ids=[native.SIMD_NAMES[x] for x in LEVELS])
def level(request: pytest.FixtureRequest) -> Iterator[int]:
    """Each kernel set this CPU runs: the batch guarantee holds within every one of them."""
    native.set_simd(request.param)
    yield request.param
    native.set_simd(native.SIMD_AUTO)


def test_kit_families_batch_bitwise_equal_alone(kit_engine: Engine, level: int) -> None:
    chunks, seen = run_batched(kit_engine, SCHEDULE, seed=1)
    assert_alone_equal(kit_engine, chunks, seen)


@pytest.mark.parametrize("simd", SIMD_LEVELS, ids=[native.SIMD_NAMES[x] for x in SIMD_LEVELS])
def test_embedded_model_batch_bitwise_equal_alone(engine: Engine, simd: int) -> None:
    native.set_simd(simd)
    try:
        chunks, seen = run_batched(engine, SMALL_SCHEDULE, seed=2)
        assert_alone_equal(engine, chunks, seen)
    finally:
        native.set_simd(native.SIMD_AUTO)


def test_batch_is_one_forward_pass(kit_engine: Engine) -> None:
    """Four decode steps together cost the pool dispatches of about one (the loop over
    sessions cost four times as many), and a MoE family reads each chosen expert once."""
    rng = np.random.default_rng(5)
    n_vocab = kit_engine.info.n_vocab
    sessions = [kit_engine.new_session(64) for _ in range(4)]
    try:
        for s in sessions:
            s.eval(rng.integers(0, n_vocab, 6).tolist())

        def dispatches(steps) -> int:
            native.Profile.enable()
            try:
                kit_engine.eval_batch(steps)
                return native.Profile.read()[1]["dispatches"]
            finally:
                native.Profile.disable()

        one = dispatches([(sessions[0], [7])])
        four = dispatches([(s, [int(t)]) for s, t in zip(sessions, rng.integers(0, n_vocab, 4),
                                                         strict=True)])  # fmt: skip
        assert 0 < one <= four < 2 * one
        model = kit_engine.model
        if not isinstance(model, MoEDecoderModel):
            assert lib.ds4n_moe_decoder_expert_bytes(model.handle) == -1  # not a MoE decoder
            return
        alone = 0
        for s in sessions:
            before = model.expert_bytes
            kit_engine.eval_batch([(s, [3])])
            alone += model.expert_bytes - before
        before = model.expert_bytes
        kit_engine.eval_batch([(s, [3]) for s in sessions])
        together = model.expert_bytes - before
        # the same token at (mostly) the same depth: the sessions share experts
        assert 0 < together < alone
    finally:
        for s in sessions:
            s.close()


def verification_rows_equal_alone(engine: Engine, seed: int) -> None:
    """A speculative verification in the batch (Engine.eval_batch with rows): sessions
    with chunks of 2..8 tokens asking every row's logits, beside plain decode steps and a
    chunk asking only its last rows, in one call, get each row bitwise what the chunk
    alone gives with every position's logits (Session.eval_all_logits), and each session
    then holds what it holds alone."""
    rng = np.random.default_rng(seed)
    n_vocab = engine.info.n_vocab
    prompts = [rng.integers(0, n_vocab, n).tolist() for n in (5, 9, 3, 12)]
    chunks = [rng.integers(0, n_vocab, n).tolist() for n in (8, 1, 3, 5)]
    rows = [8, 1, 3, 2]
    batch = [engine.new_session(N_CTX) for _ in prompts]
    try:
        for s, p in zip(batch, prompts, strict=True):
            s.eval(p)
        got = engine.eval_batch(list(zip(batch, chunks, strict=True)), rows)
        for i, (s, p, c, r) in enumerate(zip(batch, prompts, chunks, rows, strict=True)):
            assert got[i].shape == (r, n_vocab) and s.tokens == p + c
            with engine.new_session(N_CTX) as alone:
                alone.eval(p)
                want = alone.eval_all_logits(c)[-r:]
                np.testing.assert_array_equal(got[i], want, err_msg=f"session {i}")
                np.testing.assert_array_equal(s.compute_logits(), alone.compute_logits())
        # one session alone with rows: the same native call, the same rows
        with engine.new_session(N_CTX) as one, engine.new_session(N_CTX) as alone:
            one.eval(prompts[0])
            alone.eval(prompts[0])
            np.testing.assert_array_equal(engine.eval_batch([(one, chunks[0])], [8])[0],
                                          alone.eval_all_logits(chunks[0]))  # fmt: skip
        with pytest.raises(EngineError, match="rows of logits"):
            engine.eval_batch([(batch[0], [1, 2]), (batch[1], [3])], [3, 1])
        with pytest.raises(EngineError, match="row counts"):
            engine.eval_batch([(batch[0], [1, 2])], [1, 1])
    finally:
        for s in batch:
            s.close()


def test_kit_families_verification_rows_bitwise_equal_alone(kit_engine: Engine) -> None:
    verification_rows_equal_alone(kit_engine, seed=11)


def test_embedded_model_verification_rows_bitwise_equal_alone(engine: Engine) -> None:
    verification_rows_equal_alone(engine, seed=12)


def chunks_equal_steps_across_split_boundaries(engine: Engine, seed: int,
                                               starts: list[int]) -> None:  # fmt: skip
    """A chunk of 8 tokens with every row's logits (a speculative verification) gives each
    row bitwise what a decode step at that row gives, at every start of `starts` (500 to
    520, 760 to 780: decode steps begin to split their keys at 512 keys and split them
    more at 768, so some of these chunks reach a split plan their first rows' steps do not
    have; they are then planned row by row: decoder_attention.c). Fails without that; and,
    for gemma3 (a window of 48 keys in the kit), without the window's online-softmax steps
    aligned to absolute key blocks (native/attention_generic.h): its chunks that cross 512
    or 768 keys had their rows from there on grouped into other steps than their decode
    steps'."""
    rng = np.random.default_rng(seed)
    tokens = rng.integers(0, engine.info.n_vocab, 800).tolist()
    with engine.new_session(820) as steps, engine.new_session(820) as chunk:
        steps.eval(tokens[:500])
        chunk.eval(tokens[:500])
        step_logits = {}
        for pos in range(500, max(starts) + 8):
            steps.eval(tokens[pos : pos + 1])
            step_logits[pos] = steps.compute_logits().copy()
        for start in starts:
            chunk.rewind(500)
            for pos in range(500, start):  # the KV the steps hold (a longer prefill chunk's
                chunk.eval(tokens[pos : pos + 1])  # rows differ in the last bits)
            rows = chunk.eval_all_logits(tokens[start : start + 8])
            for i in range(8):
                np.testing.assert_array_equal(rows[i], step_logits[start + i],
                                              err_msg=f"chunk at {start}, row {i}")  # fmt: skip


def test_kit_families_chunks_equal_steps_across_split_boundaries(kit_engine: Engine) -> None:
    chunks_equal_steps_across_split_boundaries(kit_engine, 13, [*range(500, 521), *range(760, 781)])


def test_embedded_model_chunks_equal_steps_across_split_boundaries(engine: Engine) -> None:
    chunks_equal_steps_across_split_boundaries(engine, 14, list(range(503, 513)))


def _state(s):
    return s._state


def test_refused_batches_change_nothing(engine: Engine) -> None:
    """The native checks (the engine checks first too): a bad token in one sequence, a
    session twice, a sequence past its context, a count of zero and too many or no
    sequences each refuse the whole call; every session then continues exactly as one
    that never saw the refused call."""
    rng = np.random.default_rng(9)
    model = engine.model
    prompts = [rng.integers(0, 1000, n).tolist() for n in (5, 9)]
    a, b = (engine.new_session(32) for _ in prompts)
    tiny = engine.new_session(4)
    try:
        for s, p in zip((a, b), prompts, strict=True):
            s.eval(p)
        tiny.eval([1, 2, 3])
        logits = np.empty((2, engine.info.n_vocab), np.float32)
        ok = np.array([11], np.int32)
        bad_calls = [
            ([a, b], [ok, np.array([engine.info.n_vocab], np.int32)], "out of range"),
            ([a, b], [ok, np.array([-1], np.int32)], "out of range"),
            ([a, a], [ok, ok], "bad batch"),
            ([a, tiny], [ok, np.array([1, 2], np.int32)], "context is full"),
            ([a, b], [ok, np.array([], np.int32)], "bad batch"),
        ]
        for states, toks, message in bad_calls:
            with pytest.raises(EngineError, match=message):
                model.eval_batch([_state(s) for s in states], toks, logits)
        handles = (ctypes.c_void_p * (MAX_BATCH + 1))(*[_state(a).handle] * (MAX_BATCH + 1))
        counts = (ctypes.c_int64 * (MAX_BATCH + 1))(*[1] * (MAX_BATCH + 1))
        toks = np.ones(MAX_BATCH + 1, np.int32)
        fn = lib.ds4n_dec_model_eval_batch
        for n in (0, -1, MAX_BATCH + 1):
            rc = fn(model.handle, model.pool.handle, handles,
                    toks.ctypes.data_as(ctypes.POINTER(ctypes.c_int32)), counts, n, None)  # fmt: skip
            assert rc == -5
        # rows of logits outside 1..count of a sequence: refused before anything runs
        rows_fn = lib.ds4n_dec_model_eval_rows
        two = (ctypes.c_void_p * 2)(_state(a).handle, _state(b).handle)
        for want in ((0, 1), (1, 2), (2, 1)):
            rc = rows_fn(model.handle, model.pool.handle, two,
                         toks.ctypes.data_as(ctypes.POINTER(ctypes.c_int32)), counts, 2,
                         (ctypes.c_int64 * 2)(*want),
                         logits.ctypes.data_as(ctypes.POINTER(ctypes.c_float)))  # fmt: skip
            assert rc == -5, want
        with pytest.raises(ContextFullError):
            engine.eval_batch([(a, [1]), (tiny, [2, 3])])
        with pytest.raises(EngineError, match="twice"):
            engine.eval_batch([(a, [1]), (a, [2])])
        assert _state(a).n_past == 5 and _state(b).n_past == 9 and _state(tiny).n_past == 3
        engine.eval_batch([(a, [11, 12]), (b, [13])])
        for s, p, extra in ((a, prompts[0], [11, 12]), (b, prompts[1], [13])):
            with engine.new_session(32) as alone:
                alone.eval(p)
                alone.eval(extra)
                np.testing.assert_array_equal(alone.compute_logits(), s.compute_logits())
    finally:
        for s in (a, b, tiny):
            s.close()


def test_state_of_another_model_is_refused(engine: Engine, kit_engine: Engine) -> None:
    with engine.new_session(8) as mine, kit_engine.new_session(8) as other:
        with pytest.raises(EngineError, match="another model"):
            engine.model.eval_batch([mine._state, other._state],
                                    [np.array([1], np.int32)] * 2, None)  # fmt: skip
        with pytest.raises(EngineError, match="another engine"):
            engine.eval_batch([(mine, [1]), (other, [1])])
        assert mine.n_tokens == 0 and other.n_tokens == 0


def test_phi3_long_and_short_rope_in_one_batch(tmp_path) -> None:
    """phi3 picks its rope per session by context size (the long factors past the original
    context, 1024 in this file): sessions of both kinds in one batch keep their own."""
    from ds4d.engine import phi3
    from tests.reference.tiny_dense import N_VOCAB, write_tiny

    path = write_tiny(tmp_path / "phi3.gguf", "phi3", rope_factors=True)
    rng = np.random.default_rng(4)
    steps = [[rng.integers(0, N_VOCAB, n).astype(np.int32) for n in counts]
             for counts in ((7, 12), (1, 1), (3, 1), (1, 1))]  # fmt: skip
    ctxs = (2048, 256)
    logits = np.empty((2, N_VOCAB), np.float32)
    with native.Pool(2) as pool:
        model = phi3.load(GGUFFile(path), pool)
        try:
            batch = [model.new_state(c) for c in ctxs]
            for step in steps:
                model.eval_batch(batch, step, logits)
            alone_logits = np.empty(N_VOCAB, np.float32)
            for i, c in enumerate(ctxs):
                alone = model.new_state(c)
                for step in steps:
                    alone.eval(step[i], alone_logits)
                np.testing.assert_array_equal(alone_logits, logits[i])
                alone.close()
            # the two ropes really differ: the first session's tokens in a short session
            short = model.new_state(ctxs[1])
            for step in steps:
                short.eval(step[0], alone_logits)
            assert not np.array_equal(alone_logits, logits[0])
            for s in (*batch, short):
                s.close()
        finally:
            model.close()


def test_bench_batch_cli(tmp_path) -> None:
    """`ds4d bench --batch 3`: 1, 2 and 3 sessions decoding together, each count's aggregate
    tokens/s against one session's, as a table and CSV (the speed itself is measured, not
    asserted: the machine is shared)."""
    import csv

    from tests.cli.test_commands import ds4d

    prompt = tmp_path / "prompt.txt"
    prompt.write_text("Quel ramo del lago di Como, che volge a mezzogiorno. " * 20)
    out = tmp_path / "batch.csv"
    r = ds4d("bench", "--batch", "3", "--prompt-file", str(prompt), "--ctx-start", "16",
             "--gen-tokens", "4", "--threads", "2", "--csv", str(out), timeout=300)  # fmt: skip
    assert r.returncode == 0, r.stderr
    rows = list(csv.DictReader(out.open()))
    assert [int(x["sessions"]) for x in rows] == [1, 2, 3]
    assert float(rows[0]["vs_one"]) == 1.0
    for x in rows:
        n, tps, s = int(x["sessions"]), float(x["gen_tps"]), float(x["gen_s"])
        assert tps == pytest.approx(n * 4 / s, rel=2e-2)  # gen_s is rounded in the CSV
        assert float(x["vs_one"]) == pytest.approx(tps / float(rows[0]["gen_tps"]), rel=1e-3)
    assert "vs one" in r.stdout
    bad = ds4d("bench", "--batch", "0", "--prompt-file", str(prompt), timeout=60)
    assert bad.returncode == 2 and "--batch" in bad.stderr and "Traceback" not in bad.stderr


def test_deepseek4_batches_one_session_at_a_time(tmp_path) -> None:
    """DeepSeek V4 has no batched pass: Engine.eval_batch evaluates its sessions one after
    another, with the same contract (bitwise each session alone, checked as a whole)."""
    from ds4d.tools.synth import write_deepseek4

    path = tmp_path / "synth.gguf"
    write_deepseek4(path, seed=4)
    with Engine.open(path, threads=2) as e:
        assert not hasattr(e.model, "eval_batch")
        chunks, seen = run_batched(e, SMALL_SCHEDULE, seed=3)
        assert_alone_equal(e, chunks, seen)
