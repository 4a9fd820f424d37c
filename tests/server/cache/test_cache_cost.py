"""The cost model: online rates and the plan with the lowest estimated time to first token."""

from __future__ import annotations

import pytest

from server.cache.cost import CostModel, PlanOption, Rate


def test_rate_is_unknown_until_observed_and_weights_recent_samples():
    r = Rate(decay=0.5)
    assert r.per_second is None
    r.observe(100, 1.0)
    assert r.per_second == pytest.approx(100)
    r.observe(1000, 1.0)  # (50 + 1000) / (0.5 + 1)
    assert r.per_second == pytest.approx(700)


def model(prefill_tps: float, host_bps: float, bytes_per_token: int = 1000) -> CostModel:
    m = CostModel()
    m.observe_prefill(int(prefill_tps), 1.0)
    m.observe_restore("H", int(host_bps), 1.0, int(host_bps) // bytes_per_token)
    return m


def test_longest_wins_while_the_prefill_rate_is_unknown():
    m = CostModel()
    plan = m.choose([PlanOption("A", 10), PlanOption("H", 500, 490)], 600)
    assert plan.option.source == "H" and plan.est_ms is None


def test_an_unmeasured_tier_is_assumed_as_slow_as_the_slowest_measured_one():
    m = model(prefill_tps=40_000, host_bps=10e6)
    assert m.restore_rate("D") == pytest.approx(10e6)
    assert m.choose([PlanOption("A", 10), PlanOption("D", 500, 490)], 600).option.source == "A"
    fresh = CostModel()
    fresh.observe_prefill(100, 1.0)
    assert fresh.restore_rate("D") == float("inf")


def test_fast_restore_beats_computing():
    m = model(prefill_tps=150, host_bps=2e9)  # a 2-core CPU: restoring is ~free
    plan = m.choose([PlanOption("A", 10), PlanOption("H", 500, 490)], 600)
    assert plan.option.source == "H"
    assert plan.est_ms == pytest.approx(1000 * 100 / 150 + 1000 * 490 * 1000 / 2e9)


def test_slow_restore_loses_to_computing():
    m = model(prefill_tps=40_000, host_bps=10e6)  # an accelerator with a slow host path
    plan = m.choose([PlanOption("A", 10), PlanOption("H", 500, 490)], 600)
    assert plan.option.source == "A"  # keep the slot's 10 tokens, compute the rest
    assert plan.estimates["H"] > plan.estimates["A"]


def test_ties_keep_a_before_s_and_the_longest_route_ignores_costs():
    m = model(prefill_tps=1000, host_bps=1e6)
    assert m.choose([PlanOption("S", 100), PlanOption("A", 100)], 200).option.source == "A"
    assert m.choose([PlanOption("A", 10), PlanOption("H", 500, 490)], 600, longest=True).option.source == "H"


def test_short_prefills_are_not_taken_as_the_rate():
    m = CostModel()
    m.observe_prefill(1, 0.05)  # one token: fixed step overhead, not throughput
    assert m.prefill.per_second is None


def test_a_short_restore_measures_the_per_call_overhead_not_the_rate():
    m = CostModel()
    m.observe_prefill(4000, 1.0)
    m.observe_restore("H", 6 * 4000, 0.002, 6)  # 6 tokens in 2 ms: 12 MB/s if taken as a rate
    assert m.restore["H"].per_second is None and m.overhead_ms("H") == pytest.approx(2.0)
    # a whole prefix from H still looks free per byte, plus the 2 ms a call costs
    plan = m.choose([PlanOption("A", 5), PlanOption("H", 930, 925)], 950)
    assert plan.option.source == "H"
    assert plan.est_ms == pytest.approx(1000 * 20 / 4000 + 2.0)
    # one token more than the slot keeps is not worth a call
    assert m.choose([PlanOption("A", 5), PlanOption("H", 6, 1)], 950).option.source == "A"


def test_a_tier_kept_out_by_one_slow_sample_is_probed_again():
    m = model(prefill_tps=4000, host_bps=13e6, bytes_per_token=4000)  # one slow sample
    options = [PlanOption("A", 5), PlanOption("H", 930, 925)]
    plans = [m.choose(options, 950) for _ in range(CostModel.REPROBE_AFTER - 1)]
    assert {p.option.source for p in plans} == {"A"} and not any(p.probe for p in plans)
    probe = m.choose(options, 950)
    assert probe.option.source == "H" and probe.probe and m.probes == 1
    assert m.choose(options, 950).option.source == "A"  # one probe per period
    m.observe_restore("H", 925 * 4000, 0.001, 925)  # the probe ran at 3.7 GB/s
    assert m.choose(options, 950).option.source == "H"


def test_no_probe_when_the_longest_match_is_barely_longer():
    m = model(prefill_tps=4000, host_bps=13e6, bytes_per_token=4000)
    options = [PlanOption("A", 900), PlanOption("H", 930, 30)]
    plans = [m.choose(options, 950) for _ in range(2 * CostModel.REPROBE_AFTER)]
    assert not any(p.probe for p in plans)
