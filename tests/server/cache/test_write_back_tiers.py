"""Write-back through the ordered stored tiers (server/cache/write_back_policy.py, `store`): the
first tier reads the device, once and only what it lacks; each tier below stores from the
first tier's copy (only when the whole path is stored, `to_disk`); a first tier that declines
leaves the tiers below alone. Real H and D tiers over one tree; the device is a recorder."""

from __future__ import annotations

from types import SimpleNamespace

from server.cache.disk_tier import DiskTier
from server.cache.engine_time import EngineTime
from server.cache.eviction import LRUPolicy
from server.cache.host_tier import HostTier
from server.cache.lifecycle import SessionRegistry
from server.cache.radix_tree import RadixTree
from server.cache.tiers import Source
from server.cache.write_back_policy import WriteBackPolicy
from tests.server.cache.test_disk_full import kv_for

PATH = list(range(300, 380))


def policy(tiers, tree, reads: list) -> WriteBackPolicy:
    """A write-back policy over `tiers` whose device holds PATH in sequence 5."""
    def extract(seq_id, s, e):
        reads.append((seq_id, s, e))
        return kv_for(PATH, s, e)

    kv = SimpleNamespace(seq_ids=SimpleNamespace(layout=SimpleNamespace(parked=False)), extract=extract)
    slots = SimpleNamespace(slots=[], idle=[])
    return WriteBackPolicy(runtime=SimpleNamespace(), kv=kv, slots=slots, running=lambda: [],  # type: ignore[arg-type]
                           tree=tree, tiers=tiers, registry=SessionRegistry(), min_tokens=16, resident_cells=None,
                           step_bytes=0, idle_cells=None, clock=EngineTime())


def test_the_host_reads_the_device_and_the_disk_stores_from_the_host(tmp_path):
    tree, reads = RadixTree(), []
    host = HostTier(tree, 1 << 20, LRUPolicy())
    disk = DiskTier(tree, tmp_path / "kv", 1 << 20, "fp", LRUPolicy())
    try:
        pol = policy([host, disk], tree, reads)
        assert pol.host is host
        tip = pol.store(5, PATH[:50], to_disk=False)  # a parked copy's first piece: H only
        disk.wait_idle()
        assert tip is not None and tip.values.keys() == {Source.H} and disk.lookup(PATH).length == 0
        tip = pol.store(5, PATH)
        disk.wait_idle()
        assert reads == [(5, 0, 50), (5, 50, 80)]  # the device read once, only what H lacked
        assert host.lookup(PATH).length == 80 and disk.lookup(PATH).length == 80
        assert tip is not None and Source.H in tip.values
        tree.check_invariants()
    finally:
        disk.close()


def test_without_the_host_the_disk_reads_the_device_and_no_tip_comes_back(tmp_path):
    tree, reads = RadixTree(), []
    disk = DiskTier(tree, tmp_path / "kv", 1 << 20, "fp", LRUPolicy())
    try:
        pol = policy([disk], tree, reads)
        assert pol.host is None and pol.parked is None
        assert pol.store(5, PATH[:30]) is None
        disk.wait_idle()
        assert pol.store(5, PATH) is None
        disk.wait_idle()
        assert reads == [(5, 0, 30), (5, 30, 80)] and disk.lookup(PATH).length == 80
    finally:
        disk.close()


def test_a_host_that_declines_leaves_the_tiers_below_alone(tmp_path):
    tree, reads = RadixTree(), []
    host = HostTier(tree, 16, LRUPolicy())  # 16 bytes: no path fits
    disk = DiskTier(tree, tmp_path / "kv", 1 << 20, "fp", LRUPolicy())
    try:
        pol = policy([host, disk], tree, reads)
        assert pol.store(5, PATH) is None
        disk.wait_idle()
        assert host.declined == 1 and disk.lookup(PATH).length == 0 and disk.stats()["pending_writes"] == 0
    finally:
        disk.close()


def test_no_stored_tier_stores_nothing():
    reads: list = []
    pol = policy([], None, reads)
    assert pol.store(5, PATH) is None and reads == [] and pol.host is None
