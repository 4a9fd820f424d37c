"""Tier D without a model: synthetic KV segments written, split, matched and read back."""

from __future__ import annotations

import numpy as np
import pytest

from server.cache.disk_tier import DiskMatch, DiskSegmentError, DiskTier
from server.cache.eviction import LRUPolicy
from server.cache.kv_format import KVLayout, KVSegment
from server.cache.path_kv import HeldKV
from server.cache.radix_tree import RadixTree

LAYOUT = KVLayout(False, (1, 1), (8, 8), (1, 1), (8, 8), (0, 0))


def kv_for(tokens: list[int], start: int, end: int) -> KVSegment:
    """KV whose every row encodes (position, token), so a misplaced read shows."""
    rows = np.array([[p % 256, tokens[p] % 256] * 4 for p in range(start, end)], dtype=np.uint8)
    return KVSegment(LAYOUT, start, [rows.copy(), rows.copy()], [rows.copy(), rows.copy()])


def positions(seg: KVSegment) -> list[int]:
    return [int(r[0]) for r in seg.k[0]]


@pytest.fixture()
def disk(tmp_path):
    tier = DiskTier(RadixTree(), tmp_path / "kv", 1 << 20, "fp", LRUPolicy())
    yield tier
    tier.close()


def test_a_split_by_the_writer_does_not_move_a_pending_read(disk):
    a = list(range(100, 140))
    disk.store(a, HeldKV([(0, kv_for(a, 0, len(a)))]))
    disk.wait_idle()
    match = disk.match(a[:30])
    assert match.length == 30
    b = a[:10] + [7, 8, 9]  # the writer splits the node at 10 before the read
    disk.store(b, HeldKV([(0, kv_for(b, 0, len(b)))]))
    disk.wait_idle()
    got = disk.load(match)
    assert [p for s in got for p in positions(s)] == list(range(30))
    assert len(list(disk.dir.glob("*.kvseg"))) == 2  # the split made no new file
    again = disk.match(a)
    assert [p for s in disk.load(again) for p in positions(s)] == list(range(40))
    disk.tree.check_invariants()


def test_a_load_reads_each_file_once_and_nothing_before_its_start(disk, monkeypatch):
    import server.cache.segment_format as segment_format

    a = list(range(100, 160))
    disk.store(a[:20], HeldKV([(0, kv_for(a, 0, 20))]))
    disk.wait_idle()
    disk.store(a, HeldKV([(0, kv_for(a, 0, 60))]))  # a second file: positions 20..60
    disk.wait_idle()
    for cut in (30, 40, 50):  # three splits of the second file's range
        b = a[:cut] + [cut]
        disk.store(b, HeldKV([(0, kv_for(b, 0, len(b)))]))
        disk.wait_idle()
    match = disk.match(a)
    assert len(match.parts) == 5 and len({seg.file.path for seg, _ in match.parts}) == 2
    reads: list = []
    real = segment_format.read_header
    monkeypatch.setattr(segment_format, "read_header", lambda path: reads.append(path.name) or real(path))
    got = disk.load(match)
    assert len(reads) == 2 and len(set(reads)) == 2, "each file once"
    assert len(got) == 1 and positions(got[0]) == list(range(60))
    assert got[0].blob is not None, "a state llama.cpp restores as it is, no further join"
    reads.clear()
    tail = disk.load(match, start=25)
    assert len(reads) == 1, "the first file holds nothing past position 25: not read"
    assert positions(tail[0]) == list(range(25, 60)) and tail[0].pos0 == 25
    assert [int(r[1]) for r in tail[0].k[0]] == a[25:60]
    disk.tree.check_invariants()


def test_a_range_that_does_not_start_where_the_match_needs_is_refused(disk):
    a = list(range(50))
    disk.store(a, HeldKV([(0, kv_for(a, 0, 20)), (20, kv_for(a, 20, 50))]))
    disk.wait_idle()
    m = disk.match(a)
    seg, n = m.parts[0]
    wrong = DiskMatch(m.length, [(type(seg)(seg.file, seg.start + 5, seg.end), n - 5)], m.node)
    with pytest.raises(DiskSegmentError, match="does not continue"):
        disk.load(wrong)
    assert m.node.lock_ref == 0, "the read's lock reference is released on failure"


def test_evicted_ranges_delete_their_file_only_when_unused(disk):
    a = list(range(60))
    disk.store(a, HeldKV([(0, kv_for(a, 0, 60))]))
    disk.wait_idle()
    disk.store(a[:30] + [1, 2, 3], HeldKV([(0, kv_for(a[:30] + [1, 2, 3], 0, 33))]))
    disk.wait_idle()
    files = set(disk.dir.glob("*.kvseg"))
    assert len(files) == 2
    disk.flush()
    assert not list(disk.dir.glob("*.kvseg"))
    assert disk.stats()["entries"] == 0


def test_files_are_reindexed_after_a_restart(tmp_path):
    a = list(range(200, 260))
    tier = DiskTier(RadixTree(), tmp_path / "kv", 1 << 20, "fp", LRUPolicy())
    tier.store(a, HeldKV([(0, kv_for(a, 0, len(a)))]))
    tier.wait_idle()
    tier.close()
    tier = DiskTier(RadixTree(), tmp_path / "kv", 1 << 20, "fp", LRUPolicy())
    try:
        m = tier.match(a)
        assert m.length == len(a)
        assert [p for s in tier.load(m) for p in positions(s)] == list(range(len(a)))
    finally:
        tier.close()


def test_a_match_whose_d_values_went_is_refused_though_h_keeps_the_nodes(disk):
    a = list(range(300, 340))
    disk.tree.insert(a, "H", lambda s, e: kv_for(a, s, e))  # tier H holds the same node
    disk.store(a, HeldKV([(0, kv_for(a, 0, len(a)))]))
    disk.wait_idle()
    match = disk.match(a)
    assert match.length == len(a)
    disk.flush()  # the writer's eviction, between a request's match and its read
    assert match.node.attached and "H" in match.node.values
    with pytest.raises(DiskSegmentError, match="evicted before they were read"):
        disk.load(match)
    assert match.node.lock_ref == 0
    disk.tree.check_invariants()


def test_the_files_on_disk_stay_within_the_budget_while_a_new_one_is_written(tmp_path, monkeypatch):
    """The files an eviction frees are deleted before the new file is written, not after:
    the directory itself (what a disk really holds) never exceeds the budget."""
    import server.cache.disk_tier as disk_tier

    first = list(range(40))
    probe = DiskTier(RadixTree(), tmp_path / "probe", 1 << 20, "fp", LRUPolicy())
    probe.store(first, HeldKV([(0, kv_for(first, 0, 40))]))
    probe.wait_idle()
    one_file = sum(p.stat().st_size for p in probe.dir.glob("*.kvseg"))
    probe.close()
    budget = one_file + one_file // 2  # room for one file of 40 tokens, not two
    tier = DiskTier(RadixTree(), tmp_path / "kv", budget, "fp", LRUPolicy())
    on_disk_at_each_write: list[int] = []
    write = disk_tier.write_segment_file

    def watched(directory, encoded):
        on_disk_at_each_write.append(sum(p.stat().st_size for p in directory.glob("*.kvseg")) + encoded.size)
        return write(directory, encoded)

    monkeypatch.setattr(disk_tier, "write_segment_file", watched)
    try:
        for base in (0, 100, 200):
            tokens = list(range(base, base + 40))
            tier.store(tokens, HeldKV([(0, kv_for(tokens, 0, 40))]))
            tier.wait_idle()
        assert len(on_disk_at_each_write) == 3 and tier.evictions == 2
        assert max(on_disk_at_each_write) <= budget, (on_disk_at_each_write, budget)
    finally:
        tier.close()
