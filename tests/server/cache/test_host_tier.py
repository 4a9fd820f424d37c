"""Tier H's byte budget is a hard limit: a store that cannot make room is declined."""

from __future__ import annotations

from server.cache.eviction import LRUPolicy
from server.cache.host_tier import HostTier
from server.cache.path_kv import DeviceKV
from server.cache.radix_tree import RadixTree
from server.cache.tiers import Source
from tests.server.cache.sim_payload import FakePayload
from tests.server.cache.tree_helpers import host_match


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
    assert host.store(a, DeviceKV(extractor(a, calls))) is not None
    assert host.tree.tier("H").total_bytes == 100
    calls.clear()
    assert host.store(b, DeviceKV(extractor(b, calls))) is None
    assert calls == [], "nothing is extracted for a store that cannot fit"
    assert host.tree.tier("H").total_bytes == 100 and host.declined == 1
    assert host_match(host, b).length == 0 and host_match(host, a).length == 50
    host.tree.check_invariants()


def test_an_underestimated_store_is_taken_back_out():
    host = HostTier(RadixTree(), budget_bytes=100, policy=KeepEverything())
    a = list(range(60))  # 120 bytes: no estimate yet (first store), found over budget after insert
    assert host.store(a, DeviceKV(extractor(a, []))) is None
    assert host.tree.tier("H").total_bytes == 0 and host.declined == 1
    host.tree.check_invariants()


def test_lru_makes_room_before_extracting():
    host = HostTier(RadixTree(), budget_bytes=100, policy=LRUPolicy())
    a, b = list(range(50)), list(range(1000, 1050))
    host.store(a, DeviceKV(extractor(a, [])))
    assert host.store(b, DeviceKV(extractor(b, []))) is not None
    assert host.tree.tier("H").total_bytes == 100
    assert host_match(host, a).length == 0 and host_match(host, b).length == 50


def test_host_and_disk_share_one_tree_and_evict_only_their_own_values(tmp_path):
    from server.cache.disk_tier import DiskTier
    from tests.server.cache.test_disk_tier import kv_for

    tree = RadixTree()
    host = HostTier(tree, budget_bytes=1 << 20, policy=LRUPolicy())
    disk = DiskTier(tree, tmp_path / "kv", 1 << 20, "fp", LRUPolicy())
    try:
        a = list(range(100, 140))
        stored = host.store(a, DeviceKV(lambda s, e: kv_for(a, s, e)))
        assert stored is not None and stored.tip is not None
        disk.store(a, stored)  # H hands D its values on the path
        disk.wait_idle()
        assert tree.n_nodes == 1 and set(stored.tip.values) == {Source.H, Source.D}, "one node, two tiers"
        host.flush()
        assert host_match(host, a).length == 0 and disk.match(a).length == len(a), "evicting H keeps D"
        assert len(disk.load(disk.match(a))) == 1
        host.store(a, DeviceKV(lambda s, e: kv_for(a, s, e)))
        disk.flush()
        assert disk.match(a).length == 0 and host_match(host, a).length == len(a), "evicting D keeps H"
        assert not list(disk.dir.glob("*.kvseg"))
        tree.check_invariants()
    finally:
        disk.close()


class WatchedTree(RadixTree):
    """A tree that records H's held bytes after every change (what a scrape could read)."""

    def __init__(self):
        super().__init__()
        self.held_seen: list[int] = []

    def _account(self, node, tier, payload, sign):
        super()._account(node, tier, payload, sign)
        self.held_seen.append(self.tier("H").held_bytes)


def test_a_store_larger_than_its_estimate_makes_room_before_it_inserts():
    """The estimate comes from earlier segments; the real bytes of a segment can be more (a
    larger per-token cost here). Room is made for the real bytes before the insert, so the
    held bytes never pass the budget, not even between the insert and an eviction."""
    tree = WatchedTree()
    host = HostTier(tree, budget_bytes=100, policy=LRUPolicy())
    a, b = list(range(30)), list(range(1000, 1015))
    host.store(a, DeviceKV(extractor(a, [])))  # 60 bytes: the estimate becomes 2 bytes per token
    denser = lambda s, e: FakePayload(e - s, 3, tuple(b[:e]))  # noqa: E731  (45 bytes, estimated 30: 90 fits)
    assert host.store(b, DeviceKV(denser)) is not None
    assert max(tree.held_seen) <= 100, tree.held_seen
    assert host_match(host, a).length == 0 and host_match(host, b).length == 15
    tree.check_invariants()


def _rows_kv(tokens: list[int]):
    """A device read of `tokens`: real KV segments of 32 bytes per token (two 8-byte K and V rows)."""
    import numpy as np

    from server.cache.kv_format import KVLayout, KVSegment

    layout = KVLayout(False, (1,), (8,), (1,), (8,), (0,))

    def extract(s, e):
        rows = np.full((e - s, 8), 7, dtype=np.uint8)
        return KVSegment(layout, s, [rows.copy()], [rows.copy()])
    return DeviceKV(extract)


def test_a_path_stored_across_other_tiers_nodes_keeps_the_estimate_per_token():
    """A path whose range H lacks crosses a node another tier ended (a resident owner's tip): the tree stores
    it as slices of one segment read from the device. The next store's estimate is the KV of a token, not a
    slice's share of the whole buffer (which made a 1-token slice cost the whole path per token, so the next
    store evicted all of H and was declined)."""
    tree = RadixTree()
    host = HostTier(tree, budget_bytes=1 << 20, policy=LRUPolicy())
    a = list(range(300))
    tree.insert(a[:299])  # a resident owner's path ends one token before `a` does
    assert host.store(a, _rows_kv(a)) is not None
    assert host.bytes_per_token == 16  # 8 bytes of K and 8 of V per token
    b = list(range(1000, 1300))
    assert host.store(b, _rows_kv(b)) is not None
    assert host.declined == 0 and host.evictions == 0
    assert host_match(host, a).length == 300 and host_match(host, b).length == 300
    tree.check_invariants()


class ValuesTagged:
    """A policy that keeps paths some session uses (tagged) over untagged ones, least recently used first among
    equals: how the predictive policy treats a path no session tags (worth 0)."""

    name = "tagged"

    def priority(self, node):
        return (1.0 if node.sessions else 0.0, node.last_access)


def tagger(session):
    def tag(tip):
        for node in tip.iter_up():
            node.sessions.add(session)
    return tag


def test_a_path_is_tagged_as_it_is_inserted_so_its_own_store_does_not_evict_it():
    """A parked copy is stored in pieces (server/cache/write_back.py). Tagged only once stored, its pieces were
    worth 0 meanwhile: the next piece's room was made by evicting the previous piece, then the fresh path itself
    (the store returned None, the copy was dropped; issue 58's fork misses). Tagged as each tier inserts it
    (PathKV.tag), the older path gives way instead."""
    host = HostTier(RadixTree(), budget_bytes=200, policy=ValuesTagged())  # 100 tokens of 2 bytes
    a, b = list(range(60)), list(range(1000, 1060))
    assert host.store(a, DeviceKV(extractor(a, []), tag=tagger("a"))) is not None
    assert host.store(b[:30], DeviceKV(extractor(b, []), tag=tagger("b"))) is not None
    held = host.store(b, DeviceKV(extractor(b, []), tag=tagger("b")))
    assert held is not None and held.tip.attached and "b" in held.tip.sessions
    assert host_match(host, b).length == 60 and host_match(host, a).length == 0
    assert host.declined == 0
    host.tree.check_invariants()


class ValuesSessions(ValuesTagged):
    """ValuesTagged, ranking an incoming path by its sessions the same way (PredictivePolicy.sessions_priority)."""

    def sessions_priority(self, sessions, last_used):
        return (1.0 if tuple(sessions) else 0.0, last_used)


def test_a_path_worth_less_than_all_the_host_holds_is_declined_not_let_in():
    """Under a policy that values sessions, making room for a path evicts only what ranks below it: a path no session
    uses (worth 0) does not push out paths sessions will come back to; it is declined, nothing read. A tagged path
    still pushes out an untagged one."""
    host = HostTier(RadixTree(), budget_bytes=200, policy=ValuesSessions())  # 100 tokens of 2 bytes
    a, b, c = list(range(60)), list(range(1000, 1060)), list(range(2000, 2060))
    assert host.store(a, DeviceKV(extractor(a, []), tag=tagger("a"), sessions=("a",))) is not None
    calls: list = []
    assert host.store(b, DeviceKV(extractor(b, calls))) is None
    assert calls == [] and host.declined == 1 and host_match(host, a).length == 60
    assert host.store(c, DeviceKV(extractor(c, []), tag=tagger("c"), sessions=("c",))) is not None  # an equal: LRU
    assert host_match(host, c).length == 60 and host_match(host, a).length == 0
    host.tree.check_invariants()


def test_a_store_the_host_declines_by_value_evicts_nothing():
    """A path that what ranks below it could not make room for is declined before anything is evicted for it: the
    host keeps the paths it held (it used to evict every one below the path, then decline it anyway, and stay
    half empty). `admits` answers the same without storing."""
    host = HostTier(RadixTree(), budget_bytes=200, policy=ValuesSessions())  # 100 tokens of 2 bytes
    a, b, c = list(range(60)), list(range(1000, 1030)), list(range(2000, 2090))
    assert host.store(a, DeviceKV(extractor(a, []), tag=tagger("a"), sessions=("a",))) is not None
    assert host.store(b, DeviceKV(extractor(b, []))) is not None  # worth 0, but it fits
    assert not host.admits(c, ()), "90 untagged tokens: room for them needs `a` too, which ranks above them"
    calls: list = []
    assert host.store(c, DeviceKV(extractor(c, calls))) is None
    assert calls == [] and host.declined == 1 and host.evictions == 0
    assert host_match(host, a).length == 60 and host_match(host, b).length == 30, "nothing was evicted for it"
    assert host.admits(c[:30], ()), "30 tokens fit once the other untagged path (older: LRU among equals) goes"
    assert host.admits(c, ("c",)), "tagged, `a` ranks level with it and goes first (the older)"
    host.tree.check_invariants()
