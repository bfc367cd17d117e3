"""--precision on the real embedded model (SmolLM2, Q4_1 with a Q8_0 head): the engine
reports and uses it, batched sessions stay bitwise their single-session logits on the
integer path, `exact` is the float path, and the switch is named alike in the config and
the engine."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest

from ds4d.engine import Engine, EngineError, native
from tests.engine.test_batch_forward import SMALL_SCHEDULE, assert_alone_equal, run_batched
from tests.native.test_kernels import SIMD_LEVELS

PROMPT = [1, 9690, 198, 2683, 359, 253, 5356, 5646, 11173, 3365, 3511, 314, 1945, 3149]


@pytest.fixture(scope="module", params=["int2", "int3"])
def int_engine(request: pytest.FixtureRequest, model_path: Path) -> Iterator[Engine]:
    with Engine.open(model_path, threads=2, kv_type="f32", precision=request.param) as e:
        yield e


def test_config_and_engine_name_the_same_precisions() -> None:
    from ds4d.daemon.config import PRECISIONS, Config
    from ds4d.engine.engine import DEFAULT_PRECISION
    from ds4d.engine.engine import PRECISIONS as ENGINE_PRECISIONS

    assert PRECISIONS == ENGINE_PRECISIONS
    assert Config().precision == DEFAULT_PRECISION


def test_unknown_precision_is_refused(model_path: Path) -> None:
    with pytest.raises(EngineError, match="unknown precision 'int4'"):
        Engine.open(model_path, threads=1, precision="int4")


def test_integer_path_batches_bitwise_equal_alone(int_engine: Engine) -> None:
    assert int_engine.info.precision in ("int2", "int3")
    chunks, seen = run_batched(int_engine, SMALL_SCHEDULE, seed=3)
    assert_alone_equal(int_engine, chunks, seen)


def test_integer_path_changes_the_logits_a_little(int_engine: Engine, model_path: Path) -> None:
    """The switch really reaches the matmuls: the logits differ from the exact path's, by
    far less than their spread."""
    with Engine.open(model_path, threads=2, kv_type="f32") as exact, exact.new_session(64) as a:
        assert exact.info.precision == "exact"
        a.eval(PROMPT)
        want = a.compute_logits().copy()
    with int_engine.new_session(64) as b:
        b.eval(PROMPT)
        got = b.compute_logits()
    assert got.tobytes() != want.tobytes()
    assert np.abs(got - want).max() < 0.05 * want.std()


@pytest.mark.parametrize("level", SIMD_LEVELS, ids=[native.SIMD_NAMES[x] for x in SIMD_LEVELS])
def test_integer_path_whole_forward_at_each_level(int_engine: Engine, level: int) -> None:
    """The integer path's whole forward at each SIMD level this CPU runs against the scalar
    level's. The integer matmuls are bitwise the scalar reference (tests/engine/
    test_int_kernels.py), but attention, norms and activations are the level's float
    kernels (within ~1e-6 of the scalar ones), and a perturbation that small flips the
    rounding of a few activations' last limb, so the logits are not bitwise: measured on
    this model, int2 0.018 apart (AVX2 vs scalar; its distance from exact is 0.023-0.027),
    int3 0.0002, exact 0.00005, against a spread of 9.2. The bound is 5x that; a kernel
    wrong in one lane or block moves logits by far more."""
    got = {}
    try:
        for lvl in (native.SIMD_SCALAR, level):
            native.set_simd(lvl)
            with int_engine.new_session(64) as s:
                got[lvl] = s.eval_all_logits(PROMPT).copy()  # 14 tokens: the prefill path
    finally:
        native.set_simd(native.SIMD_AUTO)
    want = got[native.SIMD_SCALAR]
    assert np.abs(got[level] - want).max() < 0.01 * want.std()


def test_types_without_integer_kernels_stay_exact() -> None:
    """The kit's llama is F16 throughout: int3 leaves every logit bitwise the exact path's
    (so the kit families' distances do not move with --precision)."""
    from tests.helpers.kit import kit_model

    logits = {}
    for precision in ("exact", "int3"):
        with Engine.open(kit_model("llama"), threads=2, kv_type="f32", precision=precision) as e:
            with e.new_session(32) as s:
                s.eval(list(range(3, 20)))
                logits[precision] = s.compute_logits().copy()
    assert logits["exact"].tobytes() == logits["int3"].tobytes()
