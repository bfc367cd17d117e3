"""native/moe.c (router, gating, grouped experts) against the float64 numpy reference, over
gating functions, activations, quant types, token counts, threads and SIMD levels; and the
claim that a call reads only the experts its tokens chose (poisoned experts, byte counter)."""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import pytest

from ds4d.engine import moe, native
from ds4d.engine.errors import EngineError
from tests.native.test_kernels import LEVELS, random_weights, reference
from tests.reference import moe_ref

F16_NAN = np.uint16(0x7E00)


@dataclass
class Case:
    params: moe.MoEParams
    ref: moe_ref.MoEWeights
    raw: dict[str, np.ndarray] = field(default_factory=dict)  # keeps the weights alive


def make_case(rng: np.random.Generator, *, n_expert: int = 8, k: int = 2, E: int = 64,
              F: int = 96, qtype: str = "F16", down_type: str | None = None,
              gating: int = moe.SOFTMAX, act: int = moe.SWIGLU, norm: bool = True,
              biases: bool = False, scale: float = 0.0) -> Case:  # fmt: skip
    down_type = down_type or qtype
    raw = {
        "router": random_weights("F32", n_expert, E, rng),
        "gate": random_weights(qtype, n_expert * F, E, rng),
        "up": random_weights(qtype, n_expert * F, E, rng),
        "down": random_weights(down_type, n_expert * E, F, rng),
    }
    ref = moe_ref.MoEWeights(
        router=reference("F32", raw["router"]).reshape(n_expert, E).astype(np.float64),
        gate=reference(qtype, raw["gate"]).reshape(n_expert, F, E).astype(np.float64),
        up=reference(qtype, raw["up"]).reshape(n_expert, F, E).astype(np.float64),
        down=reference(down_type, raw["down"]).reshape(n_expert, E, F).astype(np.float64),
    )
    p = moe.MoEParams(
        n_expert=n_expert, n_used=k, n_embd=E, n_ff=F, gating=gating, activation=act,
        norm_weights=int(norm), weights_scale=scale, oai_alpha=1.702, oai_limit=7.0,
        router=raw["router"].ctypes.data, router_type=native.F32,
        gate=raw["gate"].ctypes.data, up=raw["up"].ctypes.data, down=raw["down"].ctypes.data,
        gate_type=native.TYPES[qtype], up_type=native.TYPES[qtype],
        down_type=native.TYPES[down_type],
    )  # fmt: skip
    if biases:
        for name, shape in (("router_bias", (n_expert,)), ("gate_bias", (n_expert, F)),
                            ("up_bias", (n_expert, F)), ("down_bias", (n_expert, E))):  # fmt: skip
            b = (rng.standard_normal(shape) * 0.5).astype(np.float32)
            raw[name] = b
            setattr(p, name, b.ctypes.data)
            setattr(ref, name, b.astype(np.float64))
    return Case(p, ref, raw)


def ref_forward(case: Case, x: np.ndarray) -> np.ndarray:
    p = case.params
    return moe_ref.forward(case.ref, x, p.n_used, p.gating, bool(p.norm_weights),
                           p.activation, p.weights_scale)  # fmt: skip


def assert_separated(case: Case, x: np.ndarray) -> None:
    """The test data's k-th and (k+1)-th expert are far apart, so float32 rounding of the
    router cannot change the selection (else a mismatch would say nothing about the code)."""
    logits = np.asarray(x, np.float64) @ case.ref.router.T
    if case.ref.router_bias is not None:
        logits += case.ref.router_bias
    k = case.params.n_used
    if k == case.params.n_expert:
        return
    top = -np.sort(-logits, axis=1)
    assert (top[:, k - 1] - top[:, k] > 1e-4).all(), "pick another seed: near-tied experts"


def check(case: Case, x: np.ndarray, pool: native.Pool | None, tol: float = 2e-5) -> np.ndarray:
    assert_separated(case, x)
    scratch = moe.Scratch()
    got = scratch.forward(pool, case.params, x)
    want = ref_forward(case, x)
    err = np.abs(got - want).max()
    assert err <= tol * max(1.0, np.abs(want).max()), f"max |diff| {err}"
    return got


@pytest.fixture(scope="module", params=[1, 2], ids=["1thread", "2threads"])
def pool(request: pytest.FixtureRequest):
    with native.Pool(request.param) as p:
        yield p


# -- gating ------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "gating,norm,scale",
    [(moe.SOFTMAX, True, 0.0), (moe.SOFTMAX, False, 2.5), (moe.SIGMOID, True, 1.0),
     (moe.SIGMOID, False, 0.0), (moe.SOFTMAX_WEIGHT, False, 0.0)],
    ids=["softmax-norm", "softmax-scaled", "sigmoid-norm", "sigmoid", "softmax-weight"],
)  # fmt: skip
def test_route_matches_reference(gating: int, norm: bool, scale: float) -> None:
    rng = np.random.default_rng(1)
    case = make_case(rng, n_expert=16, k=4, gating=gating, norm=norm, scale=scale)
    logits = (rng.standard_normal((50, 16)) * 3).astype(np.float32)
    ids, weights = moe.route(case.params, logits)
    want_ids, want_w = moe_ref.route(logits, 4, gating, norm, scale)
    assert (ids == want_ids).all()
    np.testing.assert_allclose(weights, want_w, rtol=2e-6, atol=1e-7)


def test_route_ties_go_to_the_lower_id_and_nan_ranks_last() -> None:
    case = make_case(np.random.default_rng(0), n_expert=6, k=3, gating=moe.SOFTMAX_WEIGHT)
    logits = np.array([[1.0, np.nan, 2.0, 1.0, 2.0, np.nan],
                       [np.nan] * 6], np.float32)  # fmt: skip
    ids, _ = moe.route(case.params, logits)
    assert ids[0].tolist() == [2, 4, 0]
    assert ids[1].tolist() == [0, 1, 2]  # every id valid even when the router is all NaN


# -- experts -------------------------------------------------------------------------------


@pytest.mark.parametrize("T", [1, 3, 40])
@pytest.mark.parametrize("qtype", ["F16", "Q8_0", "Q4_K", "F32", "MXFP4"])
def test_forward_matches_reference(qtype: str, T: int, pool: native.Pool) -> None:
    rng = np.random.default_rng(T)
    E = 256 if qtype == "Q4_K" else 64
    case = make_case(rng, qtype=qtype, E=E, F=256, down_type="Q6_K" if qtype == "Q4_K" else None)
    check(case, rng.standard_normal((T, E)).astype(np.float32), pool)


@pytest.mark.parametrize("T", [1, 17])
def test_gpt_oss_style_biases_and_clamped_swiglu(T: int, pool: native.Pool) -> None:
    rng = np.random.default_rng(7)
    case = make_case(rng, n_expert=8, k=4, gating=moe.SOFTMAX_WEIGHT, act=moe.SWIGLU_OAI,
                     norm=False, biases=True)  # fmt: skip
    # Large inputs, so gate and up values cross the clamp limit of 7 in both directions.
    x = (rng.standard_normal((T, 64)) * 12).astype(np.float32)
    g = np.einsum("fe,te->tf", case.ref.gate[0], x)
    assert (g > 7).any() and (g < -7).any()
    check(case, x, pool)


def test_every_expert_selected(pool: native.Pool) -> None:
    rng = np.random.default_rng(11)
    case = make_case(rng, n_expert=4, k=4)
    check(case, rng.standard_normal((5, 64)).astype(np.float32), pool)


def test_chunk_rows_equal_single_token_calls(pool: native.Pool) -> None:
    """A token's output does not depend on the other tokens of its chunk."""
    rng = np.random.default_rng(5)
    case = make_case(rng, n_expert=16, k=4, qtype="Q8_0")
    x = rng.standard_normal((33, 64)).astype(np.float32)
    scratch = moe.Scratch()
    chunk = scratch.forward(pool, case.params, x)
    single = np.concatenate([scratch.forward(pool, case.params, x[t : t + 1]) for t in range(33)])
    assert np.abs(chunk - single).max() <= 1e-5 * np.abs(single).max()


@pytest.mark.parametrize("level", LEVELS, ids=[native.SIMD_NAMES[x] for x in LEVELS])
def test_every_simd_level_matches_reference(level: int, pool: native.Pool) -> None:
    rng = np.random.default_rng(3)
    case = make_case(rng, qtype="Q4_K", E=256, F=256, n_expert=6, k=2)
    native.set_simd(level)
    try:
        for T in (1, 9):
            check(case, rng.standard_normal((T, 256)).astype(np.float32), pool)
    finally:
        native.set_simd(native.SIMD_AUTO)


# -- only the chosen experts are read -------------------------------------------------------


def expert_bytes(case: Case) -> int:
    p = case.params
    return sum(a.nbytes for n, a in case.raw.items() if n != "router" and n != "router_bias") // (
        p.n_expert
    )


@pytest.mark.parametrize("T", [1, 4])
def test_unchosen_experts_are_never_read(T: int, pool: native.Pool) -> None:
    """Every expert no token chose is filled with NaN: the output is unchanged and finite, and
    the counter reports exactly the chosen experts' bytes."""
    rng = np.random.default_rng(21)
    n_expert, k, E, F = 32, 2, 64, 96
    case = make_case(rng, n_expert=n_expert, k=k, E=E, F=F, biases=True)
    x = rng.standard_normal((T, E)).astype(np.float32)
    clean = moe.Scratch().forward(pool, case.params, x)
    logits = x.astype(np.float64) @ case.ref.router.T + case.ref.router_bias
    chosen = set(moe_ref.route(logits, k, moe.SOFTMAX, True)[0].ravel().tolist())
    assert len(chosen) < n_expert // 2
    for e in set(range(n_expert)) - chosen:
        for name in ("gate", "up"):
            case.raw[name].view(np.uint16)[e * F : (e + 1) * F] = F16_NAN
        case.raw["down"].view(np.uint16)[e * E : (e + 1) * E] = F16_NAN
        for name in ("gate_bias", "up_bias", "down_bias"):
            case.raw[name][e] = np.nan
    scratch = moe.Scratch()
    poisoned = scratch.forward(pool, case.params, x)
    assert np.isfinite(poisoned).all()
    assert (poisoned == clean).all()
    assert scratch.expert_bytes == len(chosen) * expert_bytes(case)


def test_decode_reads_n_used_experts_per_token() -> None:
    rng = np.random.default_rng(2)
    case = make_case(rng, n_expert=64, k=4, qtype="Q8_0")
    scratch = moe.Scratch()
    for _ in range(10):
        scratch.forward(None, case.params, rng.standard_normal((1, 64)).astype(np.float32))
    per_expert = expert_bytes(case)
    assert scratch.expert_bytes == 10 * 4 * per_expert
    assert scratch.expert_bytes * 16 == 10 * expert_bytes(case) * case.params.n_expert


# -- refused descriptions --------------------------------------------------------------------


@pytest.mark.parametrize(
    "change",
    [{"n_used": 9}, {"n_used": 0}, {"n_expert": 0}, {"n_ff": -1}, {"gating": 0},
     {"activation": 5}, {"gate_type": 99}, {"down_type": native.Q8_0, "n_ff": 48},
     {"gate": None}],
    ids=["k>n", "k=0", "no-experts", "neg-ff", "gating", "activation", "type", "blocks",
         "missing"],
)  # fmt: skip
def test_invalid_descriptions_are_refused(change: dict) -> None:
    case = make_case(np.random.default_rng(0), n_expert=8, k=2)
    for name, value in change.items():
        setattr(case.params, name, value)
    assert not moe.valid(case.params)
    with pytest.raises(EngineError, match="refuses"):
        moe.Scratch().forward(None, case.params, np.zeros((1, 64), np.float32))
