"""Prompt-lookup drafts (ds4d.serving.lookup): what is proposed, and how the draft length
follows the acceptance rate."""

from __future__ import annotations

import pytest

from ds4d.serving.lookup import DraftLength, PromptLookup


def test_the_continuation_of_the_longest_ngram_at_its_latest_occurrence():
    # 7 8 9 follows "1 2" early on, 5 6 follows "3 1 2" later: the longer n-gram wins
    lookup = PromptLookup([1, 2, 7, 8, 9, 3, 1, 2, 5, 6, 0, 3, 1, 2])
    assert lookup.propose(2) == [5, 6]
    assert lookup.propose(10) == [5, 6, 0, 3, 1, 2]  # up to the end of the history
    lookup.extend([4])  # "2 4" never occurred, nor "1 2 4"
    assert lookup.propose(3) == []
    lookup.extend([1, 2])  # "4 1 2" never did either; "1 2" last did before the 4
    assert lookup.propose(2) == [4, 1]


def test_the_latest_occurrence_is_preferred_and_the_suffix_itself_is_not_one():
    lookup = PromptLookup([5, 6, 1, 5, 6, 2, 5, 6])
    assert lookup.propose(1) == [2]
    assert PromptLookup([5, 6]).propose(4) == []  # the only occurrence is the suffix


def test_a_repeating_run_proposes_its_period():
    lookup = PromptLookup([3, 3, 3])
    assert lookup.propose(4) == [3]  # the latest "3 3" is followed by one token so far


def test_single_tokens_do_not_draft_and_no_draft_is_asked_for_nothing():
    lookup = PromptLookup([1, 2, 3, 1])
    assert lookup.propose(3) == []  # "3 1" is new; a 1-gram is below MIN_NGRAM
    assert PromptLookup([1, 2, 1, 2]).propose(0) == []
    with pytest.raises(ValueError):
        PromptLookup(min_ngram=3, max_ngram=2)


def test_extend_matches_building_at_once():
    tokens = [1, 2, 3, 1, 2, 4, 1, 2, 3, 9, 1, 2]
    whole = PromptLookup(tokens)
    grown = PromptLookup(tokens[:5])
    for t in tokens[5:]:
        grown.extend([t])
    assert len(grown) == len(whole) == len(tokens)
    for k in range(1, 5):
        assert grown.propose(k) == whole.propose(k) == [3, 9, 1, 2][:k]


def test_draft_length_falls_to_zero_when_drafts_fail_and_probes_back():
    length = DraftLength(7, probe=2, probe_every=4)
    assert length.next() == 7  # optimistic at first
    for _ in range(5):
        length.observe(length.next() or 1, 0)
    assert length.next() == 0  # prose: nothing drafted
    for _ in range(3):
        length.observe(0, 0)
    assert length.next() == 0
    length.observe(0, 0)  # probe_every tokens without a draft: a short probe
    assert length.next() == 2
    for _ in range(6):  # copying started: the probes succeed, the length grows back
        length.observe(length.next(), length.next())
    assert length.next() == 7


def test_draft_length_follows_a_partial_rate():
    length = DraftLength(7)
    for _ in range(20):
        length.observe(4, 1)  # one kept, the second rejected: runs of about one token
    assert abs(length.rate - 0.5) < 1e-3 and length.next() == 2
    assert DraftLength(0).next() == 0


def test_the_rate_counts_only_the_tokens_checked():
    """A draft cut at its sixth token had five accepted of six checked (the last token was
    never tried): a long copy cut now and then keeps a high rate and long drafts."""
    length = DraftLength(7)
    for _ in range(20):
        length.observe(7, 5)
    assert abs(length.rate - 5 / 6) < 1e-3 and length.next() == 6
    for _ in range(20):
        length.observe(7, 7)  # all kept: nothing failed
    assert length.rate > 0.99 and length.next() == 7
