"""The cost-aware draft length (ds4d.serving.stepcost): which k pays at which costs."""

from __future__ import annotations

import math

from ds4d.serving.lookup import DraftLength
from ds4d.serving.stepcost import PROBE_SHARE, StepCost


def measured(per_token: float, draft_pass: float | None = None) -> StepCost:
    """Costs where a chunk of n tokens takes 1 + per_token (n - 1) steps of 10 ms."""
    cost = StepCost(8)
    for n in range(1, 9):
        cost.observe_chunk(n, 0.010 * (1 + per_token * (n - 1)))
    if draft_pass is not None:
        cost.observe_draft(4, 4 * 0.010 * draft_pass)
    return cost


def test_cheap_chunks_draft_long_at_a_high_rate_and_nothing_at_a_low_one():
    cost = measured(0.1)
    assert abs(cost.relative(8) - 1.7) < 1e-9
    assert cost.best_length(0.95, 7, drafting=False) == 7
    assert 0 < cost.best_length(0.5, 7, drafting=False) < 7
    assert cost.best_length(0.02, 7, drafting=False) == 0


def test_compute_bound_chunks_never_pay():
    """A chunk of n costing n steps: no acceptance rate below 1 makes a draft pay."""
    cost = measured(1.0)
    assert cost.best_length(0.95, 7, drafting=False) == 0


def test_a_draft_model_as_slow_as_the_target_never_pays_and_a_fast_one_does():
    assert measured(0.1, draft_pass=1.0).best_length(0.9, 7, drafting=True) == 0
    assert measured(0.1, draft_pass=0.05).best_length(0.9, 7, drafting=True) >= 4
    # the draft's passes count only when a draft model drafts
    assert measured(0.1, draft_pass=1.0).best_length(0.9, 7, drafting=False) == 7


def test_unmeasured_lengths_use_the_prior():
    cost = StepCost(8)
    assert cost.relative(1) == 1.0 and cost.relative(5) > 1.0
    assert cost.best_length(0.9, 7, drafting=False) > 0
    cost.observe_chunk(1, 0.01)  # one length measured alone: still the prior elsewhere
    assert cost.relative(5) == StepCost(8).relative(5)


def test_the_draft_length_probes_when_no_length_pays_as_often_as_its_budget_allows():
    """A probe of 2 whose chunk of 3 costs 3 steps (2 beyond a plain step) is made once
    the plain steps since the last draft are worth 2 / PROBE_SHARE of them, not before."""
    length = DraftLength(7, probe=2, probe_every=3)
    slow = measured(1.0)
    assert length.next(slow) == 0
    needed = math.ceil(2 / PROBE_SHARE)
    for idle in range(1, needed + 1):
        length.observe(0, 0)
        assert length.next(slow) == (2 if idle >= needed else 0), idle
    fast = measured(0.1)
    assert length.next(fast) == 7  # the optimistic start: the rate is 1


def test_a_draft_model_whose_catching_up_costs_more_than_the_budget_never_probes():
    """A draft model's probe pays for its session's catching up with every token skipped:
    at 0.1 of a step a token (the Qwen2.5-Coder pair) that alone is above PROBE_SHARE, so
    however long the plain run, it does not probe; at 0.01 a token it does, after a few tens of tokens."""
    cost = measured(0.1, draft_pass=0.45)
    cost.observe_catch_up(32, 32 * 0.010 * 0.1)
    assert abs(cost.catch_up_relative() - 0.1) < 1e-9
    assert not any(cost.probe_pays(2, idle, drafting=True) for idle in range(1, 5000))
    assert cost.probe_pays(2, 200, drafting=False)  # prompt lookup's probe: no catching up
    cheap = measured(0.1, draft_pass=0.05)
    cheap.observe_catch_up(32, 32 * 0.010 * 0.01)
    assert not cheap.probe_pays(2, 10, drafting=True) and cheap.probe_pays(2, 32, drafting=True)


def test_a_draft_model_as_slow_as_the_target_stops_before_a_plain_step_is_measured():
    """Only verification chunks measured (a request that drafted from its first step):
    t(1) comes from the shortest of them through the prior, and a draft pass costing a
    step makes drafting stop."""
    cost = StepCost(8)
    cost.observe_chunk(8, 0.010 * (1 + 0.35 * 7))
    cost.observe_draft(7, 7 * 0.010)
    assert cost.best_length(0.999, 7, drafting=True) == 0
    cost.observe_chunk(2, 0.050)  # a stray slow chunk: t(1) is not guessed from it
    assert cost.best_length(0.999, 7, drafting=True) == 0
    cheap = StepCost(8)
    cheap.observe_chunk(8, 0.010 * (1 + 0.35 * 7))
    cheap.observe_draft(7, 7 * 0.001)
    assert cheap.best_length(0.95, 7, drafting=True) > 0
