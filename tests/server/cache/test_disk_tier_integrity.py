"""Tier D integrity without a model: what a crash, a disk fault or a stranger can leave in the
cache directory is skipped with a log line and counted, and never restored.

Every test writes real segment files through the tier, damages or plants files the way a
fault would, restarts the tier on the directory and checks three things: the index loads,
the counters name the fault, and a match never returns KV from a bad file (a good file
next to it is still served).
"""

from __future__ import annotations

import hashlib
import json
import logging
import struct

import numpy as np
import pytest

from server.cache.disk_tier import (
    MAGIC,
    SUFFIX,
    CorruptSegmentFile,
    DiskTier,
    encode_segment,
    read_segment_file,
    write_segment_file,
)
from server.cache.eviction import LRUPolicy
from server.cache.kv_format import KVLayout, KVSegment
from server.cache.path_kv import HeldKV
from server.cache.radix_tree import RadixTree

LAYOUT = KVLayout(False, (1, 1), (8, 8), (1, 1), (8, 8), (0, 0))
FP = "fp"
A = list(range(100, 140))  # two unrelated paths: one gets damaged, the other must stay usable
B = list(range(500, 530))


def kv_for(tokens: list[int], start: int, end: int) -> KVSegment:
    """KV whose every row encodes (position, token), so a misplaced read shows."""
    rows = np.array([[p % 256, tokens[p] % 256] * 4 for p in range(start, end)], dtype=np.uint8)
    return KVSegment(LAYOUT, start, [rows.copy(), rows.copy()], [rows.copy(), rows.copy()])


def rows(segments: list[KVSegment]) -> list[tuple[int, int]]:
    return [(int(r[0]), int(r[1])) for s in segments for r in s.k[0]]


def expected_rows(tokens: list[int]) -> list[tuple[int, int]]:
    return [(p % 256, t % 256) for p, t in enumerate(tokens)]


def open_tier(tmp_path, budget: int = 1 << 20) -> DiskTier:
    return DiskTier(RadixTree(), tmp_path / "kv", budget, FP, LRUPolicy())


def stored(tmp_path) -> dict[str, object]:
    """A closed tier directory holding one file for A and one for B; their paths by name."""
    tier = open_tier(tmp_path)
    files = {}
    try:
        for name, tokens in (("A", A), ("B", B)):
            before = set(tier.dir.glob(f"*{SUFFIX}"))
            tier.store(tokens, HeldKV([(0, kv_for(tokens, 0, len(tokens)))]))
            tier.wait_idle()
            (files[name],) = set(tier.dir.glob(f"*{SUFFIX}")) - before
    finally:
        tier.close()
    return files


def restored(tier: DiskTier, tokens: list[int]) -> list[tuple[int, int]] | None:
    """The rows a request for `tokens` would restore, or None when nothing is (or may be) restored."""
    m = tier.match(tokens)
    if m.length == 0:
        return None
    try:
        return rows(tier.load(m))
    except CorruptSegmentFile:
        return None


def header_and_body(path) -> tuple[dict, bytes]:
    return parts(path)[0], parts(path)[2]


def parts(path) -> tuple[dict, bytes, bytes]:
    """A segment file's header, the header's stored SHA-256 and the body."""
    data = path.read_bytes()
    (hlen,) = struct.unpack("<I", data[len(MAGIC): len(MAGIC) + 4])
    start = len(MAGIC) + 4
    return json.loads(data[start: start + hlen]), data[start + hlen: start + hlen + 32], data[start + hlen + 32:]


def rewrite(path, header: dict, body: bytes, magic: bytes = MAGIC, digest: bytes | None = None) -> None:
    raw = json.dumps(header).encode()
    digest = hashlib.sha256(raw).digest() if digest is None else digest
    path.write_bytes(magic + struct.pack("<I", len(raw)) + raw + digest + body)


def assert_b_still_served(tier: DiskTier) -> None:
    assert restored(tier, B) == expected_rows(B)


def test_a_sound_directory_loads_with_nothing_counted(tmp_path):
    stored(tmp_path)
    tier = open_tier(tmp_path)
    try:
        assert restored(tier, A) == expected_rows(A)
        assert_b_still_served(tier)
        st = tier.stats()
        assert (st["skipped_files"], st["corrupt_files"], st["foreign_files"]) == (0, 0, 0)
    finally:
        tier.close()


@pytest.mark.parametrize("cut", ["inside_magic", "inside_header", "inside_digest", "inside_body", "last_byte"])
def test_a_truncated_file_is_skipped_at_start(tmp_path, caplog, cut):
    files = stored(tmp_path)
    data = files["A"].read_bytes()
    (hlen,) = struct.unpack("<I", data[len(MAGIC): len(MAGIC) + 4])
    at = {"inside_magic": 5, "inside_header": len(MAGIC) + 4 + hlen // 2,
          "inside_digest": len(MAGIC) + 4 + hlen + 10, "inside_body": len(MAGIC) + 4 + hlen + 32 + 17,
          "last_byte": len(data) - 1}[cut]
    files["A"].write_bytes(data[:at])
    with caplog.at_level(logging.WARNING, logger="server.cache.disk_tier"):
        tier = open_tier(tmp_path)
    try:
        assert tier.match(A).length == 0, "a truncated file must not even be indexed"
        st = tier.stats()
        assert (st["skipped_files"], st["corrupt_files"], st["foreign_files"]) == (1, 1, 0)
        assert files["A"].name in caplog.text and "skipped" in caplog.text
        assert_b_still_served(tier)
    finally:
        tier.close()


@pytest.mark.parametrize("content", [b"", b"not a segment", b"\x00" * 4096, MAGIC + b"\xff\xff\xff\xff" + b"x" * 64])
def test_garbage_and_empty_files_are_skipped_at_start(tmp_path, content):
    stored(tmp_path)
    (tmp_path / "kv" / f"planted{SUFFIX}").write_bytes(content)
    tier = open_tier(tmp_path)
    try:
        st = tier.stats()
        assert (st["skipped_files"], st["corrupt_files"], st["foreign_files"]) == (1, 1, 0)
        assert restored(tier, A) == expected_rows(A)
        assert_b_still_served(tier)
    finally:
        tier.close()


def test_an_unfinished_write_is_deleted_at_start(tmp_path):
    files = stored(tmp_path)
    # what a process killed inside write_segment_file leaves: a temp file, never renamed
    torn = tmp_path / "kv" / "0123abcd.tmp"
    torn.write_bytes(files["A"].read_bytes()[:100])
    tier = open_tier(tmp_path)
    try:
        assert not torn.exists()
        assert tier.stats()["skipped_files"] == 0
        assert restored(tier, A) == expected_rows(A)
    finally:
        tier.close()


def test_a_flipped_token_in_the_header_is_caught_by_the_header_checksum(tmp_path):
    """Without its own checksum, a header naming other tokens would file valid KV under the
    wrong radix path, where it is wrong KV."""
    files = stored(tmp_path)
    header, digest, body = parts(files["A"])
    other = [A[0], A[1] + 1, *A[2:]]
    header["tokens"] = other
    rewrite(files["A"], header, body, digest=digest)  # the old digest: what a bit flip leaves
    tier = open_tier(tmp_path)
    try:
        assert tier.match(other).length == 0 and tier.match(A).length == 0
        assert tier.stats()["corrupt_files"] == 1
        assert_b_still_served(tier)
    finally:
        tier.close()


def test_a_flipped_body_byte_is_caught_at_restore_counted_and_dropped(tmp_path, caplog):
    files = stored(tmp_path)
    data = bytearray(files["A"].read_bytes())
    data[-3] ^= 0x40  # same size: only the body checksum can tell
    files["A"].write_bytes(bytes(data))
    tier = open_tier(tmp_path)
    try:
        assert tier.match(A).length == len(A), "indexed from its (sound) header"
        assert tier.stats()["corrupt_files"] == 0
        with caplog.at_level(logging.WARNING, logger="server.cache.disk_tier"):
            assert restored(tier, A) is None
        assert "checksum" in caplog.text
        assert tier.stats()["corrupt_files"] == 1
        assert tier.match(A).length == 0, "a file that failed is out of the index"
        assert not files["A"].exists(), "and deleted: no node uses it any more"
        assert_b_still_served(tier)
    finally:
        tier.close()


def test_a_file_replaced_after_indexing_is_refused_at_restore(tmp_path):
    """The index remembers each file's header checksum: another sound file copied over the
    name (here B's, with its own valid checksums) is not restored in A's place."""
    files = stored(tmp_path)
    tier = open_tier(tmp_path)
    try:
        assert tier.match(A).length == len(A)
        files["A"].write_bytes(files["B"].read_bytes())
        assert restored(tier, A) is None
        assert tier.stats()["corrupt_files"] == 1
        assert_b_still_served(tier)
    finally:
        tier.close()


def test_files_of_another_model_or_format_are_foreign_skipped_and_kept(tmp_path):
    files = stored(tmp_path)
    kv_dir = tmp_path / "kv"
    # another model wrote this (every checksum is valid): a stranger, not damage
    other = write_segment_file(kv_dir, encode_segment("another-model", A, kv_for(A, 0, len(A))))
    # an older version of the format
    header, body = header_and_body(files["B"])
    old = kv_dir / f"old{SUFFIX}"
    rewrite(old, header, body, magic=b"ARBORKV2")
    tier = open_tier(tmp_path)
    try:
        st = tier.stats()
        assert (st["skipped_files"], st["corrupt_files"], st["foreign_files"]) == (2, 0, 2)
        assert other.path.exists() and old.exists(), "another model's files are not ours to delete"
        assert restored(tier, A) == expected_rows(A)
        assert_b_still_served(tier)
        with pytest.raises(Exception, match="another model"):
            read_segment_file(other.path, FP)
    finally:
        tier.close()


def test_a_header_that_lies_about_its_shape_is_corrupt(tmp_path):
    files = stored(tmp_path)
    header, body = header_and_body(files["A"])
    for i, bad in enumerate([{"n": header["n"] + 1}, {"start": -1}, {"tokens": "abc"}, {"layout": [1]},
                             {"n": 0}, {"tokens": [1.5] * len(header["tokens"])}]):
        rewrite(tmp_path / "kv" / f"lie{i}{SUFFIX}", {**header, **bad}, body)  # valid header checksum
    tier = open_tier(tmp_path)
    try:
        st = tier.stats()
        assert (st["skipped_files"], st["corrupt_files"]) == (6, 6)
        assert restored(tier, A) == expected_rows(A)
    finally:
        tier.close()


def test_a_directory_of_only_bad_files_loads_an_empty_index(tmp_path):
    kv = tmp_path / "kv"
    kv.mkdir()
    for i in range(5):
        (kv / f"junk{i}{SUFFIX}").write_bytes(bytes([i]) * (i * 100))
    (kv / "half.tmp").write_bytes(b"x")
    tier = open_tier(tmp_path)
    try:
        assert tier.stats()["entries"] == 0 and tier.stats()["corrupt_files"] == 5
        tier.store(A, HeldKV([(0, kv_for(A, 0, len(A)))]))  # and the tier still works
        tier.wait_idle()
        assert restored(tier, A) == expected_rows(A)
    finally:
        tier.close()


def test_a_smaller_budget_at_restart_evicts_down_to_it(tmp_path):
    files = stored(tmp_path)
    size = files["A"].stat().st_size
    tier = open_tier(tmp_path, budget=size)  # room for about one of the two
    try:
        st = tier.stats()
        assert st["bytes"] <= size and st["entries"] == 1 and st["evictions"] >= 1
        assert len(list(tier.dir.glob(f"*{SUFFIX}"))) == 1, "the evicted file is deleted"
    finally:
        tier.close()
