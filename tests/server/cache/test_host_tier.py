"""Tier H's byte budget is a hard limit: a store that cannot make room is declined."""

from __future__ import annotations

from server.cache.eviction import LRUPolicy
from server.cache.host_tier import HostTier
from server.cache.radix_tree import RadixTree
from tests.server.cache.sim_payload import FakePayload


class KeepEverything:
    """A policy under which nothing may be evicted (every node pinned)."""

    name = "keep"

    def priority(self, node):
        return None


def extractor(tokens, calls):
    def extract(s, e):
        calls.append((s, e))
        return FakePayload(e - s, 2, tuple(tokens[:e]))
    return extract


def test_store_is_declined_when_pinned_nodes_fill_the_budget():
    host = HostTier(RadixTree(), budget_bytes=100, policy=KeepEverything())
    a, b = list(range(50)), list(range(1000, 1050))
    calls: list = []
    assert host.store(a, extractor(a, calls)) is not None
    assert host.tree.tier("H").total_bytes == 100
    calls.clear()
    assert host.store(b, extractor(b, calls)) is None
    assert calls == [], "nothing is extracted for a store that cannot fit"
    assert host.tree.tier("H").total_bytes == 100 and host.declined == 1
    assert host.match(b).length == 0 and host.match(a).length == 50
    host.tree.check_invariants()


def test_an_underestimated_store_is_taken_back_out():
    host = HostTier(RadixTree(), budget_bytes=100, policy=KeepEverything())
    a = list(range(60))  # 120 bytes: no estimate yet (first store), found over budget after insert
    assert host.store(a, extractor(a, [])) is None
    assert host.tree.tier("H").total_bytes == 0 and host.declined == 1
    host.tree.check_invariants()


def test_lru_makes_room_before_extracting():
    host = HostTier(RadixTree(), budget_bytes=100, policy=LRUPolicy())
    a, b = list(range(50)), list(range(1000, 1050))
    host.store(a, extractor(a, []))
    assert host.store(b, extractor(b, [])) is not None
    assert host.tree.tier("H").total_bytes == 100 and host.match(a).length == 0 and host.match(b).length == 50
