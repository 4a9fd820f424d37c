"""The adaptive policy of speculative decoding (server/engine/speculative/policy.py): pure logic."""

from __future__ import annotations

import pytest

from server.engine.speculative.policy import Acceptance, DraftPolicy, StepCost


def fitted(pairs, **kw) -> StepCost:
    cost = StepCost(**kw)
    for rows, seconds in pairs:
        cost.observe(rows, seconds)
    return cost


def test_the_step_cost_is_fitted_from_rows_and_seconds():
    cost = fitted([(n, 0.020 + 0.002 * n) for n in (1, 5, 9, 1, 17, 3, 33)])
    base, per_row = cost.fit()
    assert base == pytest.approx(0.020, rel=1e-6) and per_row == pytest.approx(0.002, rel=1e-6)


def test_rows_that_never_vary_keep_the_prior_slope():
    """One row every step says nothing of what a row costs: the prior share stands in (rows are never free)."""
    base, per_row = fitted([(1, 0.02)] * 10, prior_per_row_share=0.05).fit()
    assert per_row == pytest.approx(base * 0.05) and base + per_row == pytest.approx(0.02)


def test_a_noisy_fit_never_makes_rows_free():
    base, per_row = fitted([(1, 0.03), (8, 0.02), (1, 0.031), (8, 0.019)]).fit()
    assert per_row > 0 and base > 0


def test_acceptance_follows_the_last_tested_tokens():
    acc = Acceptance()
    assert acc.p == pytest.approx(0.5)  # the prior
    for _ in range(6):
        acc.observe(drafted=8, accepted=8)
    high = acc.p
    assert high > 0.99
    for _ in range(6):
        acc.observe(drafted=8, accepted=0)  # six tested tokens, each a failure
    assert acc.p < 0.4 < high


def test_a_long_draft_cut_late_still_says_its_tokens_were_likely():
    """A draft of 48 with 40 accepted tested 41 tokens, 40 of them accepted: the conditional chance is high, not
    40/48 (the 7 after the first rejection were never tested)."""
    acc = Acceptance()
    acc.observe(drafted=48, accepted=40)
    assert acc.p > 0.8


def policy_with(per_row_share: float) -> DraftPolicy:
    policy = DraftPolicy()
    for rows in (1, 9, 1, 17, 1, 33):
        policy.observe_step(rows, 0.02 * (1 + per_row_share * rows))
    return policy


def test_a_sequence_that_keeps_getting_its_drafts_accepted_drafts_long():
    policy = policy_with(0.05)
    for _ in range(8):
        policy.observe_draft(1, drafted=16, accepted=16)
    assert policy.length(1, n_max=48, rows=1, n_decoding=1) >= 16


def test_low_acceptance_drafts_nothing_but_probes_now_and_then():
    policy = DraftPolicy(probe_every=4)
    for rows in (1, 9, 1, 17):
        policy.observe_step(rows, 0.02 + 0.01 * rows)  # rows are dear here
    for _ in range(8):
        policy.observe_draft(1, drafted=8, accepted=0)
    lengths = []
    for step in range(12):
        lengths.append(policy.length(1, n_max=48, rows=1, n_decoding=1))
        if lengths[-1] and step != 3:  # the first probe finds nothing to draft; the next ones are tested
            policy.observe_draft(1, drafted=1, accepted=0)
    assert lengths == [0, 0, 0, 1, 1, 0, 0, 0, 1, 0, 0, 0]


def test_a_wide_batch_drafts_less_than_one_stream():
    """Under load a row costs every decoding sequence its time: the same acceptance drafts fewer tokens."""
    policy = policy_with(0.05)
    for key in (1, 2):
        for _ in range(4):
            policy.observe_draft(key, drafted=8, accepted=6)
    alone = policy.length(1, n_max=48, rows=1, n_decoding=1)
    crowded = policy.length(2, n_max=48, rows=16, n_decoding=16)
    assert alone > crowded


def test_the_first_step_measures_before_it_spends_rows():
    assert DraftPolicy().length(1, n_max=48, rows=1, n_decoding=1) == 1


def test_always_drafts_the_most_allowed():
    policy = DraftPolicy(adaptive=False)
    for _ in range(8):
        policy.observe_draft(1, drafted=8, accepted=0)
    assert policy.length(1, n_max=12, rows=1, n_decoding=1) == 12
    assert policy.length(1, n_max=0, rows=1, n_decoding=1) == 0


def test_a_finished_sequence_is_forgotten():
    policy = policy_with(0.05)
    policy.observe_draft(7, drafted=8, accepted=0)
    forgotten = policy.acceptance(7).p
    assert forgotten < 0.5
    policy.forget(7)
    assert policy.acceptance(7).p == policy.overall.p > forgotten  # begun again, from the server-wide chance


def test_a_new_sequence_starts_from_what_drafting_has_been_earning():
    """Short answers that copy nothing (an agent's tool calls) teach the policy; the next sequence starts from
    that, not from an even chance, and one that copies is trusted again within a few drafts."""
    policy = policy_with(0.05)
    assert policy.length(1, n_max=48, rows=4, n_decoding=4) >= 1  # nothing learnt yet: the prior drafts
    for key in range(2, 22):
        policy.observe_draft(key, drafted=2, accepted=0)
        policy.forget(key)
    assert policy.acceptance(30).p < 0.1
    assert policy.length(21, n_max=48, rows=4, n_decoding=4) == 0
    for _ in range(6):
        policy.observe_draft(22, drafted=4, accepted=4)
    assert policy.length(22, n_max=48, rows=1, n_decoding=1) >= 4


def test_a_sequence_the_drafter_has_nothing_for_is_asked_every_few_steps():
    """Free text: every ask is a lookup that finds nothing; after a few the sequence is asked every few steps
    only, and one draft found brings it back."""
    policy = DraftPolicy(probe_every=16, empty_limit=3, empty_every=4)
    for rows in (1, 9, 1, 17):
        policy.observe_step(rows, 0.02 * (1 + 0.05 * rows))
    asked = []
    for _ in range(11):
        k = policy.length(1, n_max=8, rows=1, n_decoding=1)
        asked.append(k > 0)
        if k:
            policy.observe_empty(1)
    assert asked == [True, True, True, False, False, False, True, False, False, False, True]
    policy.observe_draft(1, drafted=1, accepted=1)
    assert policy.length(1, n_max=8, rows=1, n_decoding=1) >= 1
