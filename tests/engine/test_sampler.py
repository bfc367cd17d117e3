"""Sampler: greedy paths, filters, reproducibility, and the draw's distribution."""

from __future__ import annotations

import math

import numpy as np
import pytest

from ds4d.engine import native
from ds4d.engine.sampler import SamplingParams, distribution, make_rng, sample

N_VOCAB = 49152


@pytest.fixture(scope="module")
def logits() -> np.ndarray:
    return np.random.default_rng(7).normal(0.0, 3.0, N_VOCAB).astype(np.float32)


def draws(
    logits: np.ndarray,
    params: SamplingParams,
    n: int,
    seed: int = 1234,
    allowed: np.ndarray | None = None,
) -> np.ndarray:
    rng = make_rng(seed)
    return np.array([sample(logits, params, rng, allowed) for _ in range(n)])


def softmax(x: np.ndarray) -> np.ndarray:
    e = np.exp(x - x.max())
    return e / e.sum()


def test_temperature_zero_is_argmax(logits: np.ndarray) -> None:
    expected = int(np.argmax(logits))
    assert sample(logits, SamplingParams(temperature=0), make_rng(0)) == expected
    # Greedy ignores the other knobs and draws nothing from the generator.
    rng = make_rng(0)
    state = rng.bit_generator.state
    assert sample(logits, SamplingParams(temperature=0, top_p=0.1, min_p=0.5), rng) == expected
    assert rng.bit_generator.state == state


def test_top_k_one_is_argmax(logits: np.ndarray) -> None:
    assert set(draws(logits, SamplingParams(temperature=1.5, top_k=1), 50)) == {
        int(np.argmax(logits))
    }


def test_seeded_draws_are_reproducible(logits: np.ndarray) -> None:
    params = SamplingParams(temperature=0.8, top_k=40, top_p=0.9, min_p=0.01)
    first = draws(logits, params, 200, seed=42)
    assert np.array_equal(first, draws(logits, params, 200, seed=42))
    assert not np.array_equal(first, draws(logits, params, 200, seed=43))
    assert len(set(first)) > 1


def chi_square_ok(counts: np.ndarray, probs: np.ndarray) -> bool:
    """Pearson's chi-square against ``probs``; the bound is the 99.99th percentile
    (Wilson-Hilferty) so a correct sampler fails about once in 10^4 seeds."""
    n = counts.sum()
    expected = probs * n
    stat = float(((counts - expected) ** 2 / expected).sum())
    dof = len(probs) - 1
    z = 3.719
    bound = dof * (1 - 2 / (9 * dof) + z * math.sqrt(2 / (9 * dof))) ** 3
    return stat < bound


def test_distribution_matches_softmax_with_temperature() -> None:
    small = np.array([2.0, 1.0, 0.5, 0.0, -1.0, -3.0], dtype=np.float32)
    params = SamplingParams(temperature=0.7)
    counts = np.bincount(draws(small, params, 20_000), minlength=small.size)
    assert chi_square_ok(counts, softmax(small / 0.7))


def test_top_k_top_p_min_p_then_temperature() -> None:
    small = np.array([3.0, 2.5, 2.0, 1.0, 0.0, -1.0, -2.0, -4.0], dtype=np.float32)
    p = softmax(small)  # filters judge probabilities at temperature 1 (llama.cpp order)
    # top_k=6 drops the last two; top_p keeps the smallest prefix reaching 0.95 of what is
    # left; min_p drops what is below 0.2 x the best probability.
    k_probs = p[:6] / p[:6].sum()
    n_top_p = int(np.searchsorted(np.cumsum(k_probs), 0.95) + 1)
    kept = [i for i in range(n_top_p) if p[i] >= 0.2 * p[0]]
    assert 2 <= len(kept) < n_top_p <= 5  # top_p and min_p both cut here
    params = SamplingParams(temperature=1.3, top_k=6, top_p=0.95, min_p=0.2)
    counts = np.bincount(draws(small, params, 20_000), minlength=small.size)
    assert counts[len(kept) :].sum() == 0
    assert chi_square_ok(counts[: len(kept)], softmax(small[kept] / 1.3))


def test_top_p_on_full_vocabulary(logits: np.ndarray) -> None:
    order = np.argsort(-logits.astype(np.float64))
    mass = np.cumsum(softmax(logits.astype(np.float64))[order])
    nucleus = set(order[: int(np.searchsorted(mass, 0.5) + 1)].tolist())
    assert len(nucleus) > 64  # wider than the sampler's first look
    got = set(draws(logits, SamplingParams(top_p=0.5), 2000).tolist())
    assert got <= nucleus and len(got) > 64


def test_allowed_mask_and_ids_are_respected(logits: np.ndarray) -> None:
    ids = np.array([5, 17, 300, 4096, 49151])
    mask = np.zeros(N_VOCAB, dtype=bool)
    mask[ids] = True
    for allowed in (ids, mask):
        assert set(draws(logits, SamplingParams(temperature=2.0), 300, allowed=allowed)) <= set(
            ids.tolist()
        )
        best = int(ids[np.argmax(logits[ids])])
        greedy = SamplingParams(temperature=0)
        assert sample(logits, greedy, make_rng(0), allowed) == best
    with pytest.raises(ValueError, match="no token"):
        sample(logits, SamplingParams(), make_rng(0), np.zeros(N_VOCAB, dtype=bool))
    with pytest.raises(ValueError, match="allowed"):
        sample(logits, SamplingParams(), make_rng(0), np.array([N_VOCAB]))


def native_draws(values: np.ndarray, n: int, top_k: int = 0, top_p: float = 1.0,
                 min_p: float = 0.0, temperature: float = 1.0) -> np.ndarray:  # fmt: skip
    rng = make_rng(99)
    return np.array([native.sample(values, top_k, top_p, min_p, temperature, rng.random())
                     for _ in range(n)])  # fmt: skip


def test_native_draw_without_filters_and_with_min_p_alone() -> None:
    """ds4n_sample's own paths the Python sampler leaves to numpy: no filter, min_p only."""
    small = np.array([2.0, 1.0, 0.5, 0.0, -1.0, -3.0], dtype=np.float32)
    counts = np.bincount(native_draws(small, 20_000, temperature=0.7), minlength=small.size)
    assert chi_square_ok(counts, softmax(small / 0.7))
    counts = np.bincount(native_draws(small, 20_000, min_p=0.3), minlength=small.size)
    kept = softmax(small) >= 0.3 * softmax(small).max()
    assert counts[~kept].sum() == 0 and chi_square_ok(counts[kept], softmax(small[kept]))


def test_native_top_k_keeps_the_k_best_with_ties_by_position() -> None:
    values = np.array([1.0, 3.0, 2.0, 3.0, 2.0, 0.0, 2.0], dtype=np.float32)
    got = set(native_draws(values, 3000, top_k=4).tolist())
    assert got == {1, 3, 2, 4}  # the two 3s, then the first two of the tied 2s
    # top_k = 1 keeps the first of the tied best, whatever u.
    assert native.sample(values, 1, 1.0, 0.0, 1.0, 0.999999) == 1


def test_native_top_k_over_a_large_vocabulary_with_many_ties() -> None:
    """The whole-vocabulary top_k passes over runs of positions at once: the kept set must
    still be the k best with ties broken by position, wherever they fall."""
    rng = np.random.default_rng(3)
    values = rng.integers(0, 12, 10_007).astype(np.float32)  # many ties, odd length
    values[10_006] = 12.0  # the best in the tail past the last whole run
    order = np.lexsort((np.arange(values.size), -values))  # best first, ties by position
    for k in (1, 7, 40, 300):
        # A flat temperature weighs every kept token alike: u = (j + 1/2) / k draws the j-th.
        got = {native.sample(values, k, 1.0, 0.0, 1e30, (j + 0.5) / k) for j in range(k)}
        assert got == set(order[:k].tolist())
    values[7_000] = values[8_000] = np.inf
    assert native.sample(values, 40, 1.0, 0.0, 1.0, 0.5) == 7_000  # the first of the best
    values[5_000] = np.nan
    assert native.sample(values, 40, 1.0, 0.0, 1.0, 0.5) == 5_000  # numpy's argmax: the NaN


def test_native_top_p_nucleus_of_thousands_is_best_first_with_ties_by_position() -> None:
    """A flat distribution's nucleus holds most of the vocabulary (it is sorted by a radix
    pass there, by the heap below a few thousand): the kept set and its order must be the
    best-first prefix reaching top_p, equal weights in position order, as for a small one."""
    rng = np.random.default_rng(5)
    values = rng.integers(0, 6, 30_011).astype(np.float32)  # many exact ties, odd length
    order = np.lexsort((np.arange(values.size), -values))
    w = np.exp(values[order].astype(np.float64) - values.max())
    for top_p in (0.55, 0.9):
        need = top_p * w.sum()
        c = int(np.searchsorted(np.cumsum(w), need) + 1)
        # the cut falls well inside one tie group: rounding cannot move it by one
        before = np.cumsum(w)[c - 2]
        assert 0.01 < (need - before) / w[c - 1] < 0.99
        assert c > 4096
        # a flat temperature weighs the kept tokens alike: u = (j + 1/2) / c draws the j-th
        for j in list(range(0, c, 211)) + [c - 1]:
            got = native.sample(values, 0, top_p, 0.0, 1e30, (j + 0.5) / c)
            assert got == order[j], (top_p, j)


def test_native_sample_edge_values_and_bad_arguments() -> None:
    values = np.array([0.0, np.nan, 5.0, np.nan], dtype=np.float32)
    assert native.sample(values, 0, 1.0, 0.0, 1.0, 0.5) == 1  # numpy's argmax: first NaN
    values = np.array([0.0, np.inf, 5.0], dtype=np.float32)
    assert native.sample(values, 0, 0.9, 0.0, 1.0, 0.5) == 1
    ok = np.zeros(4, dtype=np.float32)
    for bad in [(-1, 1.0, 0.0, 1.0, 0.5), (0, 0.0, 0.0, 1.0, 0.5), (0, 1.0, 1.5, 1.0, 0.5),
                (0, 1.0, 0.0, 0.0, 0.5), (0, 1.0, 0.0, 1.0, 1.0)]:  # fmt: skip
        with pytest.raises(ValueError, match="bad sampling arguments"):
            native.sample(ok, *bad)


def test_masked_logits_are_never_drawn() -> None:
    small = np.array([-np.inf, 0.0, -np.inf, 1.0], dtype=np.float32)
    assert set(draws(small, SamplingParams(temperature=1.0, top_p=0.99), 500)) <= {1, 3}


@pytest.mark.parametrize(
    ("kwargs", "field"),
    [
        ({"temperature": -0.1}, "temperature"),
        ({"temperature": float("nan")}, "temperature"),
        ({"top_k": -1}, "top_k"),
        ({"top_k": 2.5}, "top_k"),
        ({"top_p": 0.0}, "top_p"),
        ({"top_p": 1.5}, "top_p"),
        ({"min_p": -0.1}, "min_p"),
        ({"min_p": 2}, "min_p"),
        ({"seed": -1}, "seed"),
        ({"seed": "7"}, "seed"),
    ],
)
def test_invalid_params_are_rejected(kwargs: dict, field: str) -> None:
    with pytest.raises(ValueError, match=field):
        SamplingParams(**kwargs)


@pytest.mark.parametrize(
    "kwargs",
    [
        {"top_p": 8.055195020626325e-252},  # found by the HTTP fuzzer: 0.0f natively
        {"top_p": 1e-46, "top_k": 40},
        {"temperature": 1e-300},
        {"temperature": 7.006492321624085e-46, "top_p": 0.9},  # half the tiniest float32
        {"temperature": 1e-300, "top_p": 0.9},
        {"temperature": 1e-300, "min_p": 0.05},
        {"temperature": 1e300},
        {"temperature": 1e300, "top_p": 0.5},
    ],
)
def test_values_beyond_float32_still_sample(logits: np.ndarray, kwargs: dict) -> None:
    # The draw runs in float32: a top_p or temperature that is positive as a Python float
    # but rounds to 0 (or inf) there must still give a token, the one the limit implies.
    params = SamplingParams(**kwargs)
    got = draws(logits, params, 20)
    assert ((got >= 0) & (got < N_VOCAB)).all()
    if kwargs.get("temperature") == 1e-300 or kwargs.get("top_p", 1) < 1e-40:
        assert (got == int(np.argmax(logits))).all()  # nothing but the best survives


class FixedDraw:
    """A generator whose every draw is u: where `sample` lands for a given u."""

    def __init__(self, u: float) -> None:
        self.u = u

    def random(self) -> float:
        return self.u


@pytest.mark.parametrize(
    "filters",
    [
        {},
        {"top_k": 40},
        {"top_p": 0.55},
        {"top_p": 0.9},
        {"top_k": 300, "top_p": 0.7},
        {"min_p": 0.3},
        {"top_k": 50, "min_p": 0.5},
    ],  # fmt: skip
)
def test_distribution_is_what_sample_draws_from(filters: dict) -> None:
    """distribution() (speculative sampling's p and q) keeps exactly the tokens the
    sampler draws among, ties and all: at a flat temperature every kept token weighs the
    same, so u = (j + 1/2) / c draws the j-th of c, and the c draws hit every kept token
    once only when the two agree on the set."""
    values = np.random.default_rng(5).integers(0, 6, 5003).astype(np.float32)
    flat = SamplingParams(temperature=1e30, **filters)
    p = distribution(values, flat)
    assert p is not None
    kept = np.flatnonzero(p)
    assert np.allclose(p[kept], 1 / kept.size)
    c = kept.size
    got = [sample(values, flat, FixedDraw((j + 0.5) / c)) for j in range(c)]  # type: ignore[arg-type]
    assert sorted(got) == kept.tolist()


def test_distribution_weighs_as_the_draws_do(logits: np.ndarray) -> None:
    params = SamplingParams(temperature=0.9, top_k=12, min_p=0.01)
    p = distribution(logits, params)
    assert p is not None and abs(p.sum() - 1) < 1e-12
    kept = np.flatnonzero(p)
    counts = np.bincount(draws(logits, params, 20_000), minlength=logits.size)
    assert counts[p == 0].sum() == 0
    assert chi_square_ok(counts[kept], p[kept])
    greedy = distribution(logits, SamplingParams(temperature=0))
    assert greedy is not None and greedy[int(np.argmax(logits))] == 1.0
    allowed = np.array([3, 17, 99])
    some = distribution(logits, params, allowed)
    assert some is not None and set(np.flatnonzero(some).tolist()) <= {3, 17, 99}
