"""One interface for the stored tiers (server/cache/tiers.py): H, D and R are KVTiers named
by a Source, and each counts its own hits when it serves a load."""

from __future__ import annotations

import json

import pytest

from server.cache.disk_tier import DiskTier
from server.cache.eviction import LRUPolicy
from server.cache.host_tier import HostTier
from server.cache.kv_ops import RestoreError
from server.cache.path_kv import DeviceKV, HeldKV
from server.cache.radix_tree import RadixTree
from server.cache.shared_tier import SharedTier
from server.cache.tiers import READ_AHEAD, STORED, KVTier, Source
from tests.server.cache.test_disk_full import kv_for


def test_sources_are_the_letters_stats_always_showed():
    assert [s.value for s in Source] == ["A", "S", "H", "D", "R"]
    assert Source.H == "H" and f"{Source.D}" == "D" and json.dumps({Source.R: Source.R}) == '{"R": "R"}'
    assert set(STORED) == {Source.H, Source.D, Source.R} and set(READ_AHEAD) == {Source.D, Source.R}
    assert "S" in {Source.S} and Source.A in {"A", "S"}


def test_every_stored_tier_has_the_interface():
    for cls, source in ((HostTier, Source.H), (DiskTier, Source.D), (SharedTier, Source.R)):
        assert cls.source is source
        for method in ("lookup", "load", "store", "flush", "stats"):
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
