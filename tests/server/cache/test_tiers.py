"""One interface for the stored tiers (server/cache/tiers.py): H, D and R are KVTiers named
by a Source, each counts its own hits when it serves a load, evicts by its policy, and stores
from a PathKV (server/cache/path_kv.py): the device's cells, read only for what it lacks, or
the values of the tier above, handed on without reading the device again."""

from __future__ import annotations

import json

import pytest

from server.cache.disk_tier import DiskTier
from server.cache.eviction import LRUPolicy
from server.cache.host_tier import HostTier
from server.cache.kv_ops import RestoreError
from server.cache.path_kv import DeviceKV, HeldKV, one_segment
from server.cache.radix_tree import RadixTree
from server.cache.shared_tier import SharedTier
from server.cache.tiers import READ_AHEAD, STORED, KVTier, PathKV, Source
from tests.server.cache.test_disk_full import kv_for


def test_sources_are_the_letters_stats_always_showed():
    assert [s.value for s in Source] == ["A", "S", "H", "D", "R"]
    assert Source.H == "H" and f"{Source.D}" == "D" and json.dumps({Source.R: Source.R}) == '{"R": "R"}'
    assert set(STORED) == {Source.H, Source.D, Source.R} and set(READ_AHEAD) == {Source.D, Source.R}
    assert "S" in {Source.S} and Source.A in {"A", "S"}


def test_every_stored_tier_has_the_interface():
    for cls, source in ((HostTier, Source.H), (DiskTier, Source.D), (SharedTier, Source.R)):
        assert cls.source is source
        for method in ("lookup", "load", "store", "evict", "flush", "stats", "close"):
            assert callable(getattr(cls, method)), (cls.__name__, method)


def test_host_and_disk_load_what_they_looked_up_and_count_the_hit(tmp_path):
    tree = RadixTree()
    host = HostTier(tree, 1 << 20, LRUPolicy())
    disk = DiskTier(tree, tmp_path / "kv", 1 << 20, "fp", LRUPolicy())
    try:
        assert isinstance(host, KVTier) and isinstance(disk, KVTier)
        a = list(range(50))
        host.store(a, DeviceKV(lambda s, e: kv_for(a, s, e)))
        disk.store(a, HeldKV([(0, kv_for(a, 0, 50))]))
        disk.wait_idle()
        with tree.mutex:
            walk = tree.match_prefix(a[:40])
            found = {t.source: t.lookup(a[:40], walk) for t in (host, disk)}
        assert {s: m.length for s, m in found.items()} == {Source.H: 40, Source.D: 40}
        for tier in (host, disk):
            segs = tier.load(found[tier.source], 10)
            assert segs[0].pos0 == 10 and sum(s.n_tokens for s in segs) == 30
            assert tier.hits == 1 and tier.stats()["hits"] == 1
        assert host.lookup(a).length == 50 and disk.lookup(a).length == 50  # a walk of their own
        short = host.lookup(a[:20])
        with pytest.raises(RestoreError):
            host.load(type(short)(30, short.segments, short.tip))  # segments that do not cover it
        assert host.hits == 1
    finally:
        disk.close()


def test_evict_frees_what_is_asked_oldest_first(tmp_path):
    tree = RadixTree()
    host = HostTier(tree, 1 << 20, LRUPolicy())
    disk = DiskTier(tree, tmp_path / "kv", 1 << 20, "fp", LRUPolicy())
    shared = SharedTier("redis://127.0.0.1:1/0", "fp", 16, secret="s" * 16)  # never asked: evict is local
    try:
        paths = [list(range(i * 100, i * 100 + 50)) for i in range(3)]  # three leaves, oldest first
        for p in paths:
            host.store(p, DeviceKV(lambda s, e, p=p: kv_for(p, s, e)))
            disk.store(p, HeldKV([(0, kv_for(p, 0, 50))]))
        disk.wait_idle()
        for tier in (host, disk):
            one = tier.stats()["held_bytes"] // 3
            freed = tier.evict(one + 1)  # whole values: two leaves for a bit more than one
            assert one < freed <= 2 * one + 64, tier.source  # (D: file headers differ a little)
            assert [tier.lookup(p).length for p in paths] == [0, 0, 50], tier.source
            assert tier.stats()["evictions"] == 2
            assert tier.evict(0) == 0
        assert host.stats()["evicted_bytes"] == 2 * host.stats()["held_bytes"]
        assert len(list(disk.dir.glob("*.kvseg"))) == 1
        assert shared.evict(1 << 30) == 0  # the store's own LRU bounds it
        tree.check_invariants()
    finally:
        disk.close()
        shared.close()


def test_the_host_hands_its_values_on_the_path_to_the_tiers_below(tmp_path):
    tree = RadixTree()
    host = HostTier(tree, 1 << 20, LRUPolicy())
    disk = DiskTier(tree, tmp_path / "kv", 1 << 20, "fp", LRUPolicy())
    try:
        a = list(range(60))
        reads: list = []
        device = DeviceKV(lambda s, e: reads.append((s, e)) or kv_for(a, s, e), checkpoints=lambda align: [align])
        held = host.store(a[:40], device)
        held = host.store(a, device)  # only [40, 60) is read: H holds the rest
        assert reads == [(0, 40), (40, 60)]
        assert isinstance(held, PathKV) and not held.reads_device and held.tip is not None
        assert [(pos, seg.n_tokens) for pos, seg in held.read(0, 60)] == [(0, 40), (40, 20)]  # views of H's values
        assert held.checkpoints(16) == [16]  # the path's checkpoints go with its KV
        assert disk.store(a, held) is None  # queued: nothing to hand on
        disk.wait_idle()
        assert disk.lookup(a).length == 60 and reads == [(0, 40), (40, 60)]  # the device is not read again
    finally:
        disk.close()


def test_without_the_host_the_disk_reads_only_what_it_lacks_from_the_device(tmp_path):
    disk = DiskTier(RadixTree(), tmp_path / "kv", 1 << 20, "fp", LRUPolicy())
    try:
        a = list(range(80))
        reads: list = []
        device = DeviceKV(lambda s, e: reads.append((s, e)) or kv_for(a, s, e))
        disk.store(a[:50], device)
        disk.wait_idle()
        disk.store(a, device)
        disk.wait_idle()
        disk.store(a, device)  # all of it on disk: nothing read, nothing queued
        assert reads == [(0, 50), (50, 80)] and disk.lookup(a).length == 80
    finally:
        disk.close()


def test_held_kv_makes_its_ranges_once_and_one_segment_cuts_them():
    a = list(range(30))
    made: list = []
    held = HeldKV(lambda: made.append(1) or [(0, kv_for(a, 0, 10)), (10, kv_for(a, 10, 30))])
    assert made == []  # nothing walked until a tier reads it
    assert held.read(0, 30) is held.read(5, 30) and made == [1]
    seg = one_segment(held, 5, 25)  # across both ranges: joined
    assert (seg.pos0, seg.n_tokens) == (5, 20)
    with pytest.raises(ValueError):
        one_segment(HeldKV([(10, kv_for(a, 10, 30))]), 0, 30)  # a gap at [0, 10)
    device = DeviceKV(lambda s, e: kv_for(a, s, e))
    assert device.reads_device and device.tip is None and device.checkpoints(16) == []
    assert one_segment(device, 3, 9).n_tokens == 6
