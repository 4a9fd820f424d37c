"""Budgets count what is really held: the buffers host values keep alive, the files disk
values use, and the KV waiting in the disk writer's queue. Each test measures the memory
or the files themselves, not only the tier's counters."""

from __future__ import annotations

import numpy as np

from server.cache.disk_tier import DiskTier
from server.cache.eviction import LRUPolicy
from server.cache.host_tier import HostTier
from server.cache.kv_format import KVLayout, KVSegment, segment_from_arrays
from server.cache.path_kv import DeviceKV, HeldKV
from server.cache.radix_tree import RadixTree
from tests.server.cache.tree_helpers import host_match

LAYOUT = KVLayout(False, (1,), (8,), (1,), (8,), (0,))  # 16 bytes a token
BPT = LAYOUT.bytes_per_token


def extract_one_buffer(tokens: list[int]):
    """An extractor whose every segment views one fresh buffer (as llama.cpp's state dumps)."""
    def extract(s: int, e: int) -> KVSegment:
        buf = bytearray(np.repeat((np.array(tokens[s:e]) % 256).astype(np.uint8), 8).tobytes() * 2)
        return segment_from_arrays(LAYOUT, s, e - s, buf)
    return extract


def really_held(tree: RadixTree, tier: str) -> int:
    """Bytes of the distinct buffers the tier's values keep alive, found from the arrays."""
    roots = {}
    for node in tree.nodes():
        value = node.values.get(tier)
        if value is None:
            continue
        for a in value.arrays():
            root = a
            while isinstance(getattr(root, "base", None), (np.ndarray, memoryview, bytearray, bytes)):
                root = root.base
            if isinstance(root, memoryview):
                root = root.obj
            roots[id(root)] = memoryview(root).nbytes
    return sum(roots.values())


class PinnedPaths:
    """A policy that never evicts a node on a pinned path (LRU for the rest)."""

    name = "pinned"

    def __init__(self):
        self.pinned: set[int] = set()

    def priority(self, node):
        return None if node.id in self.pinned else (node.last_access,)


def test_a_slice_that_outlives_its_buffer_is_copied_out():
    host = HostTier(RadixTree(), budget_bytes=200 * BPT, policy=LRUPolicy())
    a = list(range(100))
    c = a[:30] + list(range(200, 270))
    d = list(range(300, 360))
    host.store(a, DeviceKV(extract_one_buffer(a)))
    host.store(c, DeviceKV(extract_one_buffer(c)))  # splits a at 30: both halves view a's buffer
    assert really_held(host.tree, "H") == host.tree.tier("H").held_bytes == 170 * BPT
    assert host.store(d, DeviceKV(extract_one_buffer(d))) is not None  # evicts a's tail, the oldest leaf
    assert host_match(host, a).length == 30 and host_match(host, c).length == 100 and host_match(host, d).length == 60
    # a's buffer is freed: its first 30 tokens survive in a buffer of their own
    assert host.copied_out == 1
    assert really_held(host.tree, "H") == host.tree.tier("H").held_bytes == 160 * BPT
    host.tree.check_invariants()


def test_pinned_host_values_fill_the_budget_and_nothing_more_is_held():
    policy = PinnedPaths()
    host = HostTier(RadixTree(), budget_bytes=100 * BPT, policy=policy)
    a = list(range(100))
    result = host.store(a, DeviceKV(extract_one_buffer(a)))
    assert result is not None and result.tip is not None
    policy.pinned.update(n.id for n in result.tip.iter_up())
    for i in range(5):  # each branches off a at 40: a split, then a store that does not fit
        b = a[:40] + [150 + i] * 30
        assert host.store(b, DeviceKV(extract_one_buffer(b))) is None
        assert really_held(host.tree, "H") <= host.budget_bytes
    assert host.declined == 5 and host_match(host, a).length == 100
    host.tree.check_invariants()


def disk_bytes(disk: DiskTier) -> int:
    return sum(p.stat().st_size for p in disk.dir.glob("*.kvseg"))


def test_pinned_disk_files_fill_the_budget_and_writes_are_refused(tmp_path):
    policy = PinnedPaths()
    tree = RadixTree()
    first = list(range(100))
    probe = DiskTier(tree, tmp_path / "probe", 1 << 30, "fp", LRUPolicy())
    probe.store(first, HeldKV([(0, extract_one_buffer(first)(0, 100))]))
    probe.wait_idle()
    file_size = disk_bytes(probe)
    probe.close()

    disk = DiskTier(RadixTree(), tmp_path / "kv", int(file_size * 1.5), "fp", policy)
    try:
        disk.store(first, HeldKV([(0, extract_one_buffer(first)(0, 100))]))
        disk.wait_idle()
        policy.pinned.update(n.id for n in disk.tree.nodes())
        for i in range(4):  # each would need a file the pinned one leaves no room for
            other = [1000 + i] * 80
            disk.store(other, HeldKV([(0, extract_one_buffer(other)(0, 80))]))
            disk.wait_idle()
            assert disk_bytes(disk) <= disk.budget_bytes
        assert disk.declined == 4 and disk.match(first).length == 100
        assert disk.stats()["held_bytes"] == disk_bytes(disk)
        disk.tree.check_invariants()
    finally:
        disk.close()


def test_the_disk_budget_counts_whole_files_after_splits(tmp_path):
    disk = DiskTier(RadixTree(), tmp_path / "kv", 1 << 30, "fp", LRUPolicy())
    try:
        a = list(range(100))
        disk.store(a, HeldKV([(0, extract_one_buffer(a)(0, 100))]))
        disk.wait_idle()
        whole = disk_bytes(disk)
        disk.budget_bytes = int(whole * 1.9)
        for i in range(6):  # branches split a's file into ranges; LRU evicts ranges, files stay whole
            b = a[: 10 + 10 * i] + [200 + i] * 60
            disk.store(b, HeldKV([(0, extract_one_buffer(b)(0, len(b)))]))
            disk.wait_idle()
            assert disk_bytes(disk) <= disk.budget_bytes
            assert disk.stats()["held_bytes"] == disk_bytes(disk)
        disk.tree.check_invariants()
    finally:
        disk.close()


def test_the_disk_writer_queue_is_bounded_and_never_waits(tmp_path):
    disk = DiskTier(RadixTree(), tmp_path / "kv", 1 << 30, "fp", LRUPolicy(), queue_bytes=250 * BPT)
    try:
        with disk.tree.mutex:  # the writer waits for the tree: the queue fills
            dropped = []
            for i in range(5):
                path = [i] * 100
                assert disk.store(path, HeldKV([(0, extract_one_buffer(path)(0, 100))])) is None  # nothing to hand on
                dropped.append(disk.dropped_writes)
            assert disk.stats()["pending_bytes"] <= 250 * BPT
        assert dropped == [0, 0, 1, 2, 3] and disk.dropped_writes == 3
        disk.wait_idle()
        assert disk.stats()["pending_bytes"] == 0 and len(list(disk.dir.glob("*.kvseg"))) == 2
    finally:
        disk.close()
