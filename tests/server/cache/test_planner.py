"""The planner (server/cache/planner.py) without a model: a radix tree of simulated payloads
(tests/server/cache/sim_payload.py), stored tiers that answer from its walk, fake device
copies and rates set by hand. What the real-model router tests check end to end, the plan
itself is checked here: the longest or cheapest plan, ties A > S > H > D > R, a slow restore
rate that makes computing cheaper, partial matches, the last prompt token always computed."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from server.cache.cost import CostModel
from server.cache.planner import Candidate, Planner, defer_behind, kept_in_slot
from server.cache.tiers import Source
from server.engine.sequence import SeqStatus
from tests.server.cache.sim_payload import FakePayload, simulated_tree
from tests.server.cache.tree_helpers import locked

BPT = 2  # bytes per token of the simulated payloads


class SimTier:
    """A stored tier answering from the shared walk (what HostTier/DiskTier.lookup do)."""

    def __init__(self, source: Source):
        self.source = source
        self.lookups = 0

    def lookup(self, tokens, walk=None):
        self.lookups += 1
        span = walk.span(self.source.value)
        return SimpleNamespace(length=span.longest, tip=span.tip)


class SimShared:
    """Tier R: a store that holds `held` leading tokens of any prompt, in chunks."""

    source = Source.R

    def __init__(self, held: int, chunk: int = 16):
        self.held, self.chunk, self.lookups = held, chunk, 0

    def lookup(self, tokens, walk=None):
        self.lookups += 1
        return SimpleNamespace(length=min(self.held, len(tokens)))


class SimResident:
    """Resident owners: `take(walk)` -> (length, owner), as ResidentOwners.take."""

    def __init__(self, n: int, seq_id: int = 40):
        self.n, self.owner = n, SimpleNamespace(seq_id=seq_id)

    def take(self, m):
        return (self.n, self.owner) if self.n else (0, None)


def planner(tiers="ASHD", *, route="cost", shared=None, resident=None, costs=None):
    tree, _ = simulated_tree(bytes_per_token=BPT)
    stored = [SimTier(source) for source in (Source.H, Source.D) if source in tiers]
    stored += [shared] if shared is not None else []
    p = Planner(enabled={Source(t) for t in tiers}, tree=tree, tiers=stored, resident=resident,  # type: ignore[arg-type]
                route=route, costs=costs)
    return p, tree


def store(tree, tier: str, tokens) -> None:
    with tree.mutex:
        tree.insert(tokens, tier, FakePayload.factory(tokens, BPT))


def measured(prefill_tps: float = 1000.0, **restore_bps: float) -> CostModel:
    """A cost model with rates as if measured: prefill tokens/s, restore bytes/s per tier."""
    costs = CostModel()
    costs.observe_prefill(1000, 1000 / prefill_tps)
    for tier, bps in restore_bps.items():
        costs.observe_restore(tier, 100 * BPT, 100 * BPT / bps, 100)
    return costs


def by_source(cands):
    return {c.source: c.length for c in cands}


PROMPT = list(range(200))


def test_candidates_per_source_and_the_longest_plan():
    p, tree = planner("ASHD", route="longest")
    store(tree, "H", PROMPT[:120])
    store(tree, "D", PROMPT[:150])
    cands = p.candidates(PROMPT, slot_common=30, live=[(7, PROMPT[:60] + [999])])
    assert by_source(cands) == {Source.A: 30, Source.S: 60, Source.H: 120, Source.D: 150}
    assert next(c for c in cands if c.source is Source.S).src_seq == 7
    best, plan = p.plan(cands, len(PROMPT))
    assert best.source is Source.D and plan.option.length == 150 and plan.label == "D"
    # D restores only what neither the slot (A) nor another device copy (S) holds
    assert plan.option.restore_tokens == 150 - 60


def test_the_cheapest_plan_with_measured_rates():
    fast = measured(1000.0, H=1e9, D=1e9)
    p, tree = planner("AHD", costs=fast)
    store(tree, "H", PROMPT[:100])
    store(tree, "D", PROMPT[:150])
    best, plan = p.plan(p.candidates(PROMPT, slot_common=0), len(PROMPT))
    assert best.source is Source.D and plan.est_ms is not None
    assert plan.estimates["D"] < plan.estimates["H"] < plan.estimates["none"]


def test_a_slow_restore_rate_makes_it_compute():
    slow = measured(1000.0, H=10.0)  # 10 bytes/s: restoring 150 tokens costs 30 s
    p, tree = planner("AH", costs=slow)
    store(tree, "H", PROMPT[:150])
    cands = p.candidates(PROMPT, slot_common=0)
    best, plan = p.plan(cands, len(PROMPT))
    assert best is None and plan.label == "compute" and plan.option.length == 0
    p.note(1, len(PROMPT), cands, plan)
    assert p.shorter_than_longest == 1 and p.by_plan["compute"] == 1
    last = p.recent_plans[-1]
    assert last["plan"] == "compute" and last["candidates"]["H"]["tokens"] == 150
    assert last["compute_all_est_ms"] == pytest.approx(200.0)  # every prompt token at 1000/s
    # the longest route takes it anyway
    p.route = "longest"
    assert p.plan(cands, len(PROMPT))[0].source is Source.H


def test_until_the_prefill_rate_is_measured_the_longest_match_wins():
    p, tree = planner("AH")  # route cost, nothing measured
    store(tree, "H", PROMPT[:80])
    best, plan = p.plan(p.candidates(PROMPT, slot_common=20), len(PROMPT))
    assert best.source is Source.H and plan.est_ms is None


@pytest.mark.parametrize("route", ["longest", "cost"])
def test_ties_go_a_then_s_then_h_then_d(route):
    costs = measured(1000.0, H=1e6, D=1e6) if route == "cost" else None
    cands = [Candidate(Source.D, 50), Candidate(Source.H, 50), Candidate(Source.S, 50, src_seq=3),
             Candidate(Source.A, 50)]
    p, _ = planner("ASHD", route=route, costs=costs)
    order = []
    while cands:
        best, _ = p.plan(cands, 100)
        order.append(best.source)
        cands = [c for c in cands if c is not best]
    assert order == [Source.A, Source.S, Source.H, Source.D]


def test_a_fully_cached_prompt_still_computes_its_last_token():
    p, tree = planner("ASH", route="longest")
    store(tree, "H", PROMPT)  # all of it stored
    cands = p.candidates(PROMPT, slot_common=len(PROMPT), live=[(5, PROMPT + [7, 8])])
    assert by_source(cands) == {Source.A: 199, Source.S: 199, Source.H: 199}
    best, plan = p.plan(cands, len(PROMPT))
    assert best.source is Source.A and plan.option.length == len(PROMPT) - 1
    costs = measured(1000.0, H=1e9)
    assert costs.estimate_ms(plan.option, len(PROMPT)) == pytest.approx(1.0)  # one token computed


def test_a_partial_match_into_a_locked_node():
    p, tree = planner("AH", route="longest")
    store(tree, "H", PROMPT[:100])
    store(tree, "H", PROMPT[:60] + [900 + t for t in range(40)])  # splits the path at 60
    with tree.mutex:
        node = tree.match_prefix(PROMPT[:100]).last_node  # the edge [60, 100)
    prompt = PROMPT[:80] + [500 + t for t in range(50)]  # diverges 20 tokens into that edge
    with locked(tree, node):
        cands = p.candidates(prompt, slot_common=0)
        h = next(c for c in cands if c.source is Source.H)
        assert h.length == 80  # the whole node [0, 60) and 20 tokens of the locked one
        assert h.match.tip is not node and h.match.tip.key == tuple(PROMPT[:60])
        best, plan = p.plan(cands, len(prompt))
        assert best is h and plan.option.restore_tokens == 80
        assert node.lock_ref == 1  # planning takes no lock (the restore does, on the lease)


def test_s_takes_the_longest_device_copy_a_live_one_on_a_tie():
    p, tree = planner("AS", resident=SimResident(90, seq_id=40))
    live = [(1, PROMPT[:30]), (2, PROMPT[:90]), (3, PROMPT[:90])]
    s = next(c for c in p.candidates(PROMPT, 0, live) if c.source is Source.S)
    assert (s.length, s.src_seq, s.owner) == (90, 2, None)  # first of the longest live copies
    p.resident = SimResident(120, seq_id=40)
    s = next(c for c in p.candidates(PROMPT, 0, live) if c.source is Source.S)
    assert (s.length, s.src_seq) == (120, 40) and s.owner is p.resident.owner


def test_without_s_the_live_copies_are_not_read():
    p, _ = planner("AH")

    def live():
        raise AssertionError("read")
        yield

    assert Source.S not in by_source(p.candidates(PROMPT, 10, live()))


def test_the_shared_store_is_asked_only_when_it_could_beat_local_by_a_chunk():
    shared = SimShared(held=190, chunk=16)
    p, tree = planner("AH", shared=shared, route="longest")
    store(tree, "H", PROMPT[:190])  # local holds 190 of 199: R cannot beat it by a chunk
    assert Source.R not in by_source(p.candidates(PROMPT, 0)) and shared.lookups == 0
    p, tree = planner("AH", shared=shared, route="longest")
    store(tree, "H", PROMPT[:100])
    cands = p.candidates(PROMPT, 0)
    assert by_source(cands)[Source.R] == 190 and shared.lookups == 1
    assert p.plan(cands, len(PROMPT))[0].source is Source.R
    shared.held = 90  # asked, but holds less than local: no candidate
    assert Source.R not in by_source(p.candidates(PROMPT, 0)) and shared.lookups == 2


def test_what_the_slot_keeps_under_each_plan():
    costs = CostModel()
    plan = lambda src, n: costs.choose([], 0) if src == "none" else SimpleNamespace(  # noqa: E731
        option=SimpleNamespace(source=src, length=n))
    assert kept_in_slot(plan("A", 50), 50) == 50
    assert kept_in_slot(plan("H", 80), 50) == 50 and kept_in_slot(plan("D", 30), 50) == 30
    assert kept_in_slot(plan("S", 80), 50) == 0 and kept_in_slot(plan("none", 0), 50) == 0


def test_an_unknown_route_is_refused():
    with pytest.raises(ValueError, match="unknown cache route"):
        planner(route="shortest")


def _seq(prompt, *, status=SeqStatus.PREFILLING, n_past=0, group=None):
    return SimpleNamespace(prompt=prompt, status=status, n_past=n_past,
                           request=SimpleNamespace(prefill_group=group))


def test_defer_behind_a_request_computing_a_long_shared_prefix():
    new = _seq(PROMPT[:150] + [1])
    assert defer_behind(new, [_seq(PROMPT, n_past=10)], min_tokens=64)
    assert not defer_behind(new, [_seq(PROMPT, n_past=150)], min_tokens=64)  # computed already
    assert not defer_behind(new, [_seq(PROMPT, status=SeqStatus.DECODING)], min_tokens=64)
    short = _seq(PROMPT[:20] + [1])
    assert not defer_behind(short, [_seq(PROMPT)], min_tokens=64)
    group = object()  # choices of one request share their prompt however short
    assert defer_behind(_seq(PROMPT[:20] + [1], group=group), [_seq(PROMPT[:20] + [2], group=group)], 64)
