"""Tier D on a full disk (issue 35, item 8): a write that fails (ENOSPC) leaves no temp file
and is counted; a free-space reserve declines writes before the disk fills, after evicting
the tier's own least valuable files; the directory is fsynced after each rename; and the host
tier, the tree and later writes go on as if D were simply smaller. No model: synthetic KV."""

from __future__ import annotations

import errno
import shutil
from collections import namedtuple

import numpy as np
import pytest

import server.cache.disk_space as disk_space
import server.cache.segment_format as segment_format
from server.cache.disk_tier import DiskTier
from server.cache.eviction import LRUPolicy
from server.cache.host_tier import HostTier
from server.cache.kv_format import KVLayout, KVSegment
from server.cache.path_kv import DeviceKV, HeldKV
from server.cache.radix_tree import RadixTree

LAYOUT = KVLayout(False, (1, 1), (8, 8), (1, 1), (8, 8), (0, 0))
Usage = namedtuple("Usage", "total used free")


def kv_for(tokens: list[int], start: int, end: int) -> KVSegment:
    rows = np.array([[p % 256, tokens[p] % 256] * 4 for p in range(start, end)], dtype=np.uint8)
    return KVSegment(LAYOUT, start, [rows.copy(), rows.copy()], [rows.copy(), rows.copy()])


def store(disk: DiskTier, tokens: list[int]) -> None:
    disk.store(tokens, HeldKV([(0, kv_for(tokens, 0, len(tokens)))]))
    disk.wait_idle()


def files(disk: DiskTier, pattern: str = "*") -> list[str]:
    return sorted(p.name for p in disk.dir.glob(pattern))


class FullDisk:
    """A writable file that takes `room` bytes, then fails as a full filesystem does."""

    def __init__(self, room: int):
        self.room = room
        self.real_open = open

    def open(self, path, mode="r", *a, **kw):
        f = self.real_open(path, mode, *a, **kw)
        if "w" not in mode:
            return f
        outer = self

        class Wrapped:
            def __enter__(self):
                return self

            def __exit__(self, *exc):
                f.close()

            def write(self, data):
                n = memoryview(data).nbytes
                if n > outer.room:
                    f.write(memoryview(data).cast("B")[:outer.room])
                    outer.room = 0
                    raise OSError(errno.ENOSPC, "No space left on device")
                outer.room -= n
                return f.write(data)

            def __getattr__(self, name):
                return getattr(f, name)

        return Wrapped()


@pytest.fixture()
def tree():
    return RadixTree()


def test_enospc_mid_write_leaves_no_temp_file_is_counted_and_the_tier_goes_on(tree, tmp_path, monkeypatch, caplog):
    disk = DiskTier(tree, tmp_path / "kv", 1 << 20, "fp", LRUPolicy())
    try:
        full = FullDisk(room=100)  # the header fits, the body does not
        monkeypatch.setattr(segment_format, "open", full.open, raising=False)
        a = list(range(100, 140))
        store(disk, a)
        assert files(disk) == []  # no .tmp left behind (not even until the next start), no .kvseg
        st = disk.stats()
        assert (st["write_errors"], st["no_space_errors"], st["entries"]) == (1, 1, 0)
        assert disk.held(a) == 0
        store(disk, list(range(200, 240)))  # still full: counted, the warning is not repeated
        assert disk.stats()["no_space_errors"] == 2 and files(disk) == []
        assert caplog.text.count("segments are not written until space is back") == 1
        assert "Traceback" not in caplog.text  # a full disk is an expected condition, not a crash
        monkeypatch.undo()  # space is back
        store(disk, a)
        assert disk.held(a) == len(a) and len(files(disk, "*.kvseg")) == 1 and files(disk, "*.tmp") == []
        assert [int(r[0]) for r in disk.load(disk.match(a))[0].k[0]] == list(range(40))
    finally:
        disk.close()


def test_a_write_that_fails_at_fsync_or_rename_leaves_no_temp_file(tree, tmp_path, monkeypatch):
    disk = DiskTier(tree, tmp_path / "kv", 1 << 20, "fp", LRUPolicy())
    try:
        for target in ("fsync", "replace"):
            def fail(*a, target=target, **kw):
                raise OSError(errno.EIO, f"{target} failed")

            with monkeypatch.context() as m:
                m.setattr(segment_format.os, target, fail)
                store(disk, list(range(10, 50)))
            assert files(disk) == [], target
        assert disk.stats()["write_errors"] == 2 and disk.stats()["no_space_errors"] == 0
    finally:
        disk.close()


def test_the_directory_is_fsynced_after_the_rename(tree, tmp_path, monkeypatch):
    disk = DiskTier(tree, tmp_path / "kv", 1 << 20, "fp", LRUPolicy())
    seen = []
    real = segment_format.fsync_directory

    def recording(directory):
        seen.append((directory, files(disk, "*.kvseg"), files(disk, "*.tmp")))  # the rename is done
        real(directory)

    monkeypatch.setattr(segment_format, "fsync_directory", recording)
    try:
        store(disk, list(range(40)))
        assert len(seen) == 1 and seen[0][0] == disk.dir and len(seen[0][1]) == 1 and seen[0][2] == []
    finally:
        disk.close()


def test_a_reserve_larger_than_the_free_space_declines_every_write(tree, tmp_path):
    free = shutil.disk_usage(tmp_path).free
    disk = DiskTier(tree, tmp_path / "kv", 1 << 20, "fp", LRUPolicy(), reserve_bytes=free + (1 << 30))
    try:
        a = list(range(40))
        store(disk, a)
        st = disk.stats()
        assert (st["declined_low_space"], st["entries"], st["write_errors"]) == (1, 0, 0)
        assert files(disk) == [] and disk.held(a) == 0
    finally:
        disk.close()


def test_below_the_reserve_the_tiers_own_oldest_files_go_first(tree, tmp_path, monkeypatch):
    """A filesystem of `capacity` bytes that only this tier writes to: the reserve is met by
    evicting D's least recently used file, then the write goes ahead."""
    disk = DiskTier(tree, tmp_path / "kv", 1 << 20, "fp", LRUPolicy())
    a, b, c = list(range(1000, 1040)), list(range(2000, 2040)), list(range(3000, 3040))  # files of one size
    store(disk, a)
    size = next(disk.dir.glob("*.kvseg")).stat().st_size
    capacity = 3 * size + 10  # room for 3 files; the reserve below leaves room for 2

    def usage(path):
        used = sum(p.stat().st_size for p in disk.dir.glob("*"))
        return Usage(capacity, used, capacity - used)

    monkeypatch.setattr(disk_space.shutil, "disk_usage", usage)
    disk.space.reserve_bytes = size
    try:
        store(disk, b)
        assert disk.held(a) == 40 and disk.held(b) == 40
        disk.match(a)  # a is used after b: b is now the least recently used
        tree.match_prefix(a)
        store(disk, c)  # 3 files would leave less than the reserve: b goes, c is written
        assert (disk.held(a), disk.held(b), disk.held(c)) == (40, 0, 40)
        assert disk.stats()["declined_low_space"] == 0 and len(files(disk, "*.kvseg")) == 2
        disk.space.reserve_bytes = capacity  # nothing can meet it: everything evictable goes, then declined
        store(disk, list(range(4000, 4040)))
        assert disk.stats()["declined_low_space"] == 1 and files(disk) == []
    finally:
        disk.close()


def test_with_the_disk_full_the_host_tier_still_stores_and_restores(tree, tmp_path, monkeypatch):
    """What a request needs from the cache (H holds the path, a match finds it) does not
    depend on D: with D failing every write, H serves as before."""
    host = HostTier(tree, 1 << 20, LRUPolicy())
    disk = DiskTier(tree, tmp_path / "kv", 1 << 20, "fp", LRUPolicy())
    monkeypatch.setattr(segment_format, "open", FullDisk(room=0).open, raising=False)
    try:
        a = list(range(500, 560))
        tip = host.store(a, DeviceKV(lambda s, e: kv_for(a, s, e)))
        assert tip is not None
        store(disk, a)
        assert disk.stats()["no_space_errors"] == 1 and files(disk) == []
        with tree.mutex:
            m = host.take(tree.match_prefix(a))
        assert m.length == 60
        assert [int(r[0]) for s in m.segments for r in s.k[0]] == list(range(60))
        tree.check_invariants()
    finally:
        disk.close()
