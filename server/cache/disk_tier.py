"""Tier D: KV segments in files, surviving restarts (and crashes).

One file per stored range:

    "ARBORKV3" | u32 header length | header (JSON) | SHA-256 of the header (32 bytes) | body

The header holds the model fingerprint, the full token path up to the range's end, where
the range starts, its KV layout and the SHA-256 of the body; the body is the raw K/V
arrays in llama.cpp's own layout (written from the segment's views, read back into one
buffer and viewed, never copied byte by byte). The header has its own checksum because it
says *where* the KV belongs: a flipped token id would put valid KV on the wrong radix path.

Crash safety: files are written to a temp name, fsynced, renamed (`os.replace`) and the
directory fsynced (so the rename itself survives a power loss), so a process killed mid-write
leaves only a `*.tmp` file, which the next start deletes; a write that fails (ENOSPC, EIO, a
quota) deletes its temp file at once; a `.kvseg` name always means a complete write.

Free space: before each write the filesystem's free space is checked (`shutil.disk_usage`);
a write that would leave less than `reserve_bytes` free first evicts this tier's own files (by
the policy; pinned and locked ones stay) and, if that is not enough, is declined and counted
(`declined_low_space`), as is one that fails for lack of space (`no_space_errors`): the disk
tier stops growing, requests go on with the tiers above it (a full disk never fails a
request; the disk budget is a second bound, the reserve the one that sees other writers). Nothing is trusted for that alone: at start
the directory is indexed from the headers (checksummed) and the file sizes (a truncated
body is caught without reading it); the body checksum is verified when a request restores
the file, while it holds a lock reference on the matched path, and each read range must
start where the match says and the header must be the one indexed. Every file that fails
is skipped with a log line and counted: `corrupt_files` (torn, truncated, garbage, a
checksum mismatch, at start or at restore) and `foreign_files` (another model, KV layout
or format version; left on disk, never loaded). A restore that fails falls back to
computing the prompt (server/cache/router.py), so a bad file costs time, never an answer.

The index is the "D" values of the radix tree shared with tier H (server/cache/
radix_tree.py): a node's D value is a `DiskSegment`, a token range of one file; splitting
a node (by either tier) splits the range (no I/O) and a file is deleted when no node
refers to it any more. Evicting D values never drops a node's H value, and the D budget
counts the files D values use, each whole (a file stays until its last range goes); a
write that the budget cannot make room for (pinned or locked files) is refused. Files are
written by a writer thread whose queue is bounded in bytes (server/cache/bounded_writer.py: a
full queue drops the store, counted), so storing never waits on the disk, and the tree lock is never held during file I/O: the writer decides what is missing
under the lock, writes the file without it, then indexes it under the lock.
"""

from __future__ import annotations

import errno
import hashlib
import json
import logging
import os
import shutil
import struct
import uuid
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from server.cache.bounded_writer import BoundedWriter
from server.cache.budget import BudgetResult, ByteBudget, enforce_budget
from server.cache.eviction import EvictionPolicy
from server.cache.host_tier import TierMatch
from server.cache.kv_format import EmptyStateBlob, KVLayout, KVSegment, segment_from_arrays
from server.cache.radix_tree import EvictResult, MatchResult, RadixNode, RadixTree

log = logging.getLogger(__name__)

TIER = "D"
MAGIC = b"ARBORKV3"
FAMILY = b"ARBORKV"  # any version of the format: an older one is foreign, not corrupt
VERSION = 3
SUFFIX = ".kvseg"
DIGEST_BYTES = 32  # SHA-256 bytes after the header
DEFAULT_QUEUE_BYTES = 64 << 20  # KV waiting for the writer: past it, stores are dropped
MAX_HEADER = 64 << 20  # a longer header length is garbage (a path of 8M tokens is far beyond any context)


class DiskSegmentError(RuntimeError):
    """A segment file is missing, corrupt or of another model."""


class CorruptSegmentFile(DiskSegmentError):
    """Torn, truncated, garbage, or a checksum does not match: never loaded, counted."""


class ForeignSegmentFile(DiskSegmentError):
    """A sound file of another model, KV layout or format version: never loaded, counted."""


@dataclass(eq=False)
class SegmentFile:
    """One file on disk: the KV of positions [start, start + n); `refs` nodes use it."""

    path: Path
    start: int
    n: int
    size: int
    header_sha256: str = ""  # the header indexed: a read of another file under this name fails
    refs: int = 0

    @property
    def nbytes(self) -> int:
        """What the file holds on disk while any node uses a range of it (the D budget's unit)."""
        return self.size


@dataclass(eq=False)
class DiskSegment:
    """A node's D value: positions [start, end) of one segment file."""

    file: SegmentFile
    start: int
    end: int
    released: bool = field(default=False, repr=False)

    @property
    def n_tokens(self) -> int:
        return self.end - self.start

    @property
    def nbytes(self) -> int:
        return self.file.size * self.n_tokens // self.file.n

    @property
    def memory(self) -> SegmentFile:
        return self.file

    def split(self, offset: int) -> tuple[DiskSegment, DiskSegment]:
        """Two ranges of the same file (no I/O): the file now has one more user."""
        self.file.refs += 1
        return DiskSegment(self.file, self.start, self.start + offset), DiskSegment(self.file, self.start + offset,
                                                                                    self.end)


def _layout_to_json(layout: KVLayout) -> dict:
    return {k: (list(v) if isinstance(v, tuple) else v) for k, v in layout.__dict__.items()}


def layout_from_json(d: dict) -> KVLayout:
    return KVLayout(bool(d["v_trans"]), *(tuple(d[k]) for k in ("k_types", "k_row_bytes", "v_types",
                                                                   "v_row_bytes", "v_el_bytes")))


@dataclass(frozen=True)
class EncodedSegment:
    """A segment file's bytes before it is written: its size is known without any I/O."""

    head: bytes  # magic, header length, header, header checksum
    arrays: list[np.ndarray]
    start: int
    n: int
    header_sha256: str

    @property
    def size(self) -> int:
        return len(self.head) + sum(a.nbytes for a in self.arrays)


def encode_segment(fingerprint: str, path_tokens: list[int], seg: KVSegment) -> EncodedSegment:
    """The file for `seg` (the KV of path_tokens[seg.pos0:]): the arrays are kept as they
    are (a transposed-V slice is made contiguous) and checksummed, not copied."""
    arrays = [np.ascontiguousarray(a) for a in seg.arrays()]
    digest = hashlib.sha256()
    for a in arrays:
        digest.update(a.data)
    header = json.dumps({
        "version": VERSION, "fingerprint": fingerprint, "tokens": list(path_tokens), "start": seg.pos0,
        "n": seg.n_tokens, "layout": _layout_to_json(seg.layout), "sha256": digest.hexdigest(),
    }).encode()
    header_digest = hashlib.sha256(header).digest()
    head = MAGIC + struct.pack("<I", len(header)) + header + header_digest
    return EncodedSegment(head, arrays, seg.pos0, seg.n_tokens, header_digest.hex())


def write_segment_file(directory: Path, encoded: EncodedSegment) -> SegmentFile:
    """Write a file atomically: to a temp file, fsynced, renamed, then the directory fsynced
    (the rename is durable). The arrays go to the file from their own memory. On any error
    (ENOSPC included) the temp file is deleted before the error propagates."""
    final = directory / f"{uuid.uuid4().hex}{SUFFIX}"
    tmp = final.with_suffix(".tmp")
    try:
        with open(tmp, "wb") as f:
            f.write(encoded.head)
            for a in encoded.arrays:
                f.write(a.data)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, final)
    except BaseException:
        tmp.unlink(missing_ok=True)  # a failed write leaves nothing behind (not even until the next start)
        raise
    fsync_directory(directory)
    return SegmentFile(final, encoded.start, encoded.n, final.stat().st_size, encoded.header_sha256)


def fsync_directory(directory: Path) -> None:
    """Make the directory's entries (a rename, an unlink) durable: without it a power loss
    after the rename may lose the new name although the file's data were synced."""
    fd = os.open(directory, os.O_RDONLY | getattr(os, "O_DIRECTORY", 0))
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


NO_SPACE_ERRNOS = frozenset({errno.ENOSPC, errno.EDQUOT})


def read_header(path: Path) -> tuple[dict, int, str]:
    """The checked header of a segment file, the offset of its body and the header's SHA-256.
    Raises ForeignSegmentFile for another format version, CorruptSegmentFile for anything
    that is not a whole, checksummed header (OSError when the file cannot be read)."""
    with open(path, "rb") as f:
        head = f.read(len(MAGIC) + 4)
        if head[: len(FAMILY)] == FAMILY and len(head) >= len(MAGIC) and head[: len(MAGIC)] != MAGIC:
            raise ForeignSegmentFile(f"{path.name}: written by another version of the segment format")
        if len(head) < len(MAGIC) + 4 or head[: len(MAGIC)] != MAGIC:
            raise CorruptSegmentFile(f"{path.name}: not a whole Arbor KV segment file (torn or garbage)")
        (hlen,) = struct.unpack("<I", head[len(MAGIC):])
        if hlen > MAX_HEADER:
            raise CorruptSegmentFile(f"{path.name}: implausible header length {hlen}")
        raw = f.read(hlen)
        digest = f.read(DIGEST_BYTES)
    if len(raw) != hlen or len(digest) != DIGEST_BYTES:
        raise CorruptSegmentFile(f"{path.name}: the file ends inside its header (torn write)")
    if hashlib.sha256(raw).digest() != digest:
        raise CorruptSegmentFile(f"{path.name}: header checksum mismatch (corrupt file)")
    try:
        header = json.loads(raw)
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise CorruptSegmentFile(f"{path.name}: unreadable header") from exc
    if not isinstance(header, dict):
        raise CorruptSegmentFile(f"{path.name}: unreadable header")
    return header, len(MAGIC) + 4 + hlen + DIGEST_BYTES, digest.hex()


def _check_header(path: Path, header: dict, fingerprint: str, size: int, offset: int) -> tuple[list[int], KVLayout]:
    """The header's token path and layout, if the file is of this model and whole (its size
    is what the header promises: a truncated body is caught without reading it)."""
    if header.get("fingerprint") != fingerprint:
        raise ForeignSegmentFile(f"{path.name}: written for another model or KV layout")
    try:
        start, n, tokens = header["start"], header["n"], header["tokens"]
        layout = layout_from_json(header["layout"])
        ok = (isinstance(tokens, list) and all(type(t) is int for t in tokens) and type(start) is int
              and type(n) is int and 0 <= start and 0 < n and start + n == len(tokens))
        expected = offset + n * int(layout.bytes_per_token)
    except (KeyError, TypeError, ValueError) as exc:
        raise CorruptSegmentFile(f"{path.name}: inconsistent header ({type(exc).__name__}: {exc})") from exc
    if not ok:
        raise CorruptSegmentFile(f"{path.name}: inconsistent header")
    if size != expected:
        raise CorruptSegmentFile(f"{path.name}: {size} bytes where the header promises {expected} (truncated or torn)")
    return tokens, layout


def read_segment_file(path: Path, fingerprint: str, header_sha256: str | None = None) -> KVSegment:
    """The whole file's segment, checked (header, size, body checksum, and when given, that
    the header is the one indexed): one read into one buffer, arrays are views."""
    try:
        header, offset, digest = read_header(path)
        with open(path, "rb") as f:
            size = os.fstat(f.fileno()).st_size
            f.seek(offset)
            body = bytearray(max(size - offset, 0))
            got = f.readinto(body)
    except OSError as exc:
        raise DiskSegmentError(f"{path.name}: {exc}") from exc
    if header_sha256 is not None and digest != header_sha256:
        raise CorruptSegmentFile(f"{path.name}: not the file that was indexed under this name")
    _, layout = _check_header(path, header, fingerprint, size, offset)
    if got != len(body) or hashlib.sha256(body).hexdigest() != header.get("sha256"):
        raise CorruptSegmentFile(f"{path.name}: body checksum mismatch (corrupt file)")
    return segment_from_arrays(layout, header["start"], header["n"], body)


def read_ranges(ranges: list[tuple[SegmentFile, int, int]], fingerprint: str) -> KVSegment:
    """The KV of consecutive path ranges, each (file, start, end) in path positions, as one
    sequence state ready for llama.cpp. Each file is read once and checked (the header it was
    indexed under, its size, the body checksum). A range that is a whole file goes from the
    file straight into the state's rows (one copy; V not transposed); a part of a file is
    read whole (to check it), then its rows are copied."""
    blob: EmptyStateBlob | None = None
    first, total = ranges[0][1], sum(e - s for _, s, e in ranges)
    for file, a, b in ranges:
        path = file.path
        try:
            header, offset, digest = read_header(path)
            if file.header_sha256 and digest != file.header_sha256:
                raise CorruptSegmentFile(f"{path.name}: not the file that was indexed under this name")
            with open(path, "rb") as f:
                size = os.fstat(f.fileno()).st_size
                _, layout = _check_header(path, header, fingerprint, size, offset)
                if (header["start"], header["n"]) != (file.start, file.n):
                    raise CorruptSegmentFile(f"{path.name}: holds other positions than indexed")
                if blob is None:
                    blob = EmptyStateBlob(layout, first, total)
                elif layout != blob.layout:
                    raise CorruptSegmentFile(f"{path.name}: another KV layout than the files before it")
                f.seek(offset)
                digest = hashlib.sha256()
                if (a, b) == (file.start, file.start + file.n) and not layout.v_trans:
                    for li in range(2 * layout.n_layer):
                        dst = memoryview(blob.rows(li, a - first, b - first)).cast("B")
                        if f.readinto(dst) != dst.nbytes:
                            raise CorruptSegmentFile(f"{path.name}: the body ends early (truncated)")
                        digest.update(dst)
                else:
                    body = bytearray(size - offset)
                    if f.readinto(body) != len(body):
                        raise CorruptSegmentFile(f"{path.name}: the body ends early (truncated)")
                    digest.update(body)
                    part = segment_from_arrays(layout, file.start, file.n, body).slice(a - file.start, b - file.start)
                    for li, src in enumerate(part.arrays()):
                        blob.rows(li, a - first, b - first)[...] = src
        except OSError as exc:
            raise DiskSegmentError(f"{path.name}: {exc}") from exc
        if digest.hexdigest() != header.get("sha256"):
            raise CorruptSegmentFile(f"{path.name}: body checksum mismatch (corrupt file)")
    assert blob is not None
    return blob.segment()


def cover(ranges: list[tuple[int, KVSegment]], s: int, e: int) -> KVSegment | None:
    """The KV of [s, e) cut from consecutive (start, segment) ranges, or None if not covered."""
    parts = []
    pos = s
    for start, seg in ranges:
        end = start + seg.n_tokens
        if end <= pos or start >= e:
            continue
        if start > pos:
            return None
        parts.append(seg if (pos, min(e, end)) == (start, end) else seg.slice(pos - start, min(e, end) - start))
        pos = min(e, end)
        if pos == e:
            return KVSegment.join(parts)
    return None


@dataclass(frozen=True)
class DiskMatch:
    """A prefix held on disk: `length` tokens from the ranges in `parts` (in path order;
    the last may be used only partly), found under the lock; `node` is the deepest node used."""

    length: int
    parts: list[tuple[DiskSegment, int]]
    node: RadixNode | None


class DiskTier:
    name = TIER

    def __init__(self, tree: RadixTree, directory: Path, budget_bytes: int, fingerprint: str,
                 policy: EvictionPolicy, queue_bytes: int = DEFAULT_QUEUE_BYTES, reserve_bytes: int = 0):
        """`reserve_bytes`: free space the filesystem must keep after a write; a write that
        would go below it is declined (counted), see the module's "Free space"."""
        self.dir = directory
        self.dir.mkdir(parents=True, exist_ok=True)
        self.budget_bytes = budget_bytes
        self.fingerprint = fingerprint
        self.policy = policy
        self.tree = tree
        self._lock = tree.mutex  # shared with tier H: every use of the tree holds it
        self._doomed: list[Path] = []  # files no node uses any more; unlinked outside the lock
        self.queue_bytes = queue_bytes  # KV the writer's queue may hold (see store)
        self.declined = 0  # writes refused because pinned or locked files filled the budget
        self.reserve_bytes = reserve_bytes
        self.declined_low_space = 0  # writes refused: they would leave less than reserve_bytes free
        self.no_space_errors = 0  # writes that failed for lack of space (ENOSPC, EDQUOT): temp file deleted
        self._low_space = False  # logged once per episode, not at every declined write
        self.hits = 0
        self.evictions = 0
        self.skipped_files = 0  # files not indexed at start (corrupt or foreign)
        self.corrupt_files = 0  # torn, truncated, garbage or checksum failures, at start or at restore
        self.foreign_files = 0  # another model, KV layout or format version
        self.write_errors = 0
        self._load_index()
        self._writer = BoundedWriter("arbor-disk-writer", lambda item: self._write(*item), self._write_failed,
                                     queue_bytes)

    # ------------------------------------------------------------------ files
    def _use(self, file: SegmentFile, s: int, e: int) -> DiskSegment:
        file.refs += 1
        return DiskSegment(file, s, e)

    def _release(self, seg: DiskSegment | None) -> None:
        """A node dropped its range (caller holds the lock)."""
        if seg is not None and not seg.released:
            seg.released = True
            seg.file.refs -= 1
            if seg.file.refs <= 0:
                self._doomed.append(seg.file.path)

    def _unlink_doomed(self) -> None:
        with self._lock:
            doomed, self._doomed = self._doomed, []
        for path in doomed:
            path.unlink(missing_ok=True)

    def _place(self, tokens: list[int], file: SegmentFile) -> None:
        """Index `file` (the KV of tokens[file.start:]): it serves any range of it that the
        tree lacks (caller holds the lock); unused, it is deleted."""
        end = file.start + file.n

        def give(s: int, e: int) -> DiskSegment | None:
            return self._use(file, s, e) if file.start <= s and e <= end else None

        self.tree.insert(tokens[:end], TIER, give)
        if file.refs == 0:
            self._doomed.append(file.path)

    # ------------------------------------------------------------------ index
    def _load_index(self) -> None:
        """Index every sound file of this model in the directory; skip (log, count) the rest.
        A `*.tmp` file is a write that never finished (the process died): deleted. Corrupt
        and foreign files stay on disk, untouched: they may be evidence, or another model's."""
        for tmp in self.dir.glob("*.tmp"):
            log.info("disk cache: %s is an unfinished write (the process stopped while writing it); deleted",
                     tmp.name)
            tmp.unlink(missing_ok=True)
        entries = []
        for path in self.dir.glob(f"*{SUFFIX}"):
            try:
                header, offset, digest = read_header(path)
                size = path.stat().st_size
                tokens, _ = _check_header(path, header, self.fingerprint, size, offset)
                entries.append((tokens, SegmentFile(path, header["start"], header["n"], size, digest)))
            except (DiskSegmentError, OSError) as exc:
                self.skipped_files += 1
                self._count(exc)
                log.warning("disk cache: %s; skipped", exc)
        with self._lock:
            for tokens, file in sorted(entries, key=lambda e: (e[1].start, len(e[0]))):
                if file.start > 0:
                    self.tree.insert(tokens[: file.start])  # a hole until its parent's file is placed
                self._place(tokens, file)
            # over budget when started with a smaller budget than the files were written under
            self._make_room(0)
        self._unlink_doomed()
        if entries or self.skipped_files:
            log.info("disk cache: indexed %d segment files from %s (%d skipped: %d corrupt, %d foreign)",
                     len(entries), self.dir, self.skipped_files, self.corrupt_files, self.foreign_files)

    def _count(self, exc: Exception) -> None:
        if isinstance(exc, ForeignSegmentFile):
            self.foreign_files += 1
        elif isinstance(exc, CorruptSegmentFile):
            self.corrupt_files += 1

    def _make_room(self, incoming: int) -> bool:
        """Evict D values until the files they use, plus `incoming` bytes, fit the budget
        (caller holds the lock); False when locked or pinned files leave no room."""
        res = enforce_budget(self.tree, TIER, ByteBudget(self.budget_bytes), self.policy, incoming)
        self._released(res)
        return res.satisfied

    def _released(self, res: EvictResult | BudgetResult) -> None:
        self.evictions += len(res.freed)
        for _, seg in res.freed:
            self._release(seg)

    # ------------------------------------------------------------------ match
    def take(self, m: MatchResult) -> DiskMatch:
        """What D holds of a match of the shared tree (caller holds the lock); the last
        range may be used only partly."""
        span = m.span(TIER)
        parts = [(n.values[TIER], len(n.key)) for n in span.nodes]
        node = span.tip
        if span.partial_node is not None:
            parts.append((span.partial_node.values[TIER], span.partial_tokens))
            node = span.partial_node
        return DiskMatch(span.longest, parts, node)

    def match(self, tokens: list[int]) -> DiskMatch:
        """Longest prefix held on disk."""
        with self._lock:
            return self.take(self.tree.match_prefix(tokens))

    def held(self, tokens: list[int]) -> int:
        return self.match(tokens).length

    def load(self, match: DiskMatch, start: int = 0) -> TierMatch:
        """Read and check the files of a match from path position `start` on (what a slot
        does not hold already), as one segment ready for llama.cpp; each file is read once.
        Holds a lock reference on the path meanwhile so the writer cannot evict it; every
        range must start where the previous ended (a split or a stale match is refused,
        never restored at the wrong position). A bad file is dropped from the index.
        Safe on any thread (the I/O thread reads ahead of the engine)."""
        if match.node is None or start >= match.length:
            return TierMatch(match.length, [], match.node)
        with self._lock:
            # Evicting D values leaves a node attached while it holds H: check the values.
            if not match.node.attached or any(TIER not in n.values for n in match.node.iter_up()):
                raise DiskSegmentError("the matched segments were evicted before they were read")
            self.tree.lock(match.node)
        bad: SegmentFile | None = None
        try:
            ranges = self._ranges(match, start)
            try:
                kv = read_ranges(ranges, self.fingerprint)
            except DiskSegmentError as exc:
                bad = self._culprit(ranges, exc)
                log.warning("disk cache: %s; dropped, the prompt is computed instead", exc)
                self._count(exc)
                raise
        finally:
            with self._lock:
                self.tree.unlock(match.node)
            if bad is not None:
                self._drop_file(bad)
            self._unlink_doomed()
        return TierMatch(match.length, [kv], match.node)

    @staticmethod
    def _ranges(match: DiskMatch, start: int) -> list[tuple[SegmentFile, int, int]]:
        """The (file, start, end) path ranges to read for [start, match.length): consecutive
        parts of one file merge, parts before `start` are not read at all."""
        ranges: list[tuple[SegmentFile, int, int]] = []
        pos = 0
        for seg, n in match.parts:
            if seg.start != pos or n > seg.n_tokens:
                raise DiskSegmentError(f"segment range [{seg.start}, {seg.end}) does not continue at {pos}")
            a, b = max(pos, start), pos + n
            pos = b
            if a >= b:
                continue
            if ranges and ranges[-1][0] is seg.file and ranges[-1][2] == a:
                ranges[-1] = (seg.file, ranges[-1][1], b)
            else:
                ranges.append((seg.file, a, b))
        return ranges

    @staticmethod
    def _culprit(ranges: list[tuple[SegmentFile, int, int]], exc: DiskSegmentError) -> SegmentFile | None:
        """The file a read error names (messages start with the file's name)."""
        return next((f for f, _, _ in ranges if str(exc).startswith(f.path.name)), None)

    def _drop_file(self, file: SegmentFile) -> None:
        """Take every unlocked range of a bad file out of the index (a range another
        request holds locked goes at its own failed read or at eviction)."""
        with self._lock:
            self._unplace(file)

    # ------------------------------------------------------------------ store
    def store(self, tokens: list[int], ranges: list[tuple[int, KVSegment]]) -> bool:
        """Queue the path `tokens` for writing; `ranges` are (start, segment) pairs covering
        as much of it as the caller holds. Only what the tree holds no D value for is written.
        Never waits: when the queue already holds `queue_bytes` of KV (the disk is slower
        than the stores), the write is dropped (counted) and False returned, since queued
        ranges keep host memory alive outside every budget."""
        return self._writer.submit((list(tokens), ranges), sum(seg.nbytes for _, seg in ranges))

    @property
    def dropped_writes(self) -> int:
        """Stores dropped because the queue was full."""
        return self._writer.dropped

    def _write_failed(self, exc: Exception) -> None:
        self.write_errors += 1
        if isinstance(exc, OSError) and exc.errno in NO_SPACE_ERRNOS:
            self.no_space_errors += 1
            self._space_low(f"a write failed: {exc.strerror or exc}")
            return
        log.error("disk cache: writing segments failed: %s", exc, exc_info=exc)

    def _space_low(self, why: str) -> None:
        if not self._low_space:
            self._low_space = True
            log.warning("disk cache: %s in %s; segments are not written until space is back (requests go on "
                        "with the other tiers)", why, self.dir)

    def _room_on_disk(self, size: int) -> bool:
        """Whether writing `size` bytes leaves the filesystem `reserve_bytes` free, after
        evicting this tier's own files (by the policy) to make up a shortfall."""
        if self.reserve_bytes <= 0:
            return True
        free = shutil.disk_usage(self.dir).free
        short = self.reserve_bytes + size - free
        if short > 0:
            with self._lock:  # our own least valuable files give way to the reserve first
                held = self.tree.tier(TIER).held_bytes
                self._released(enforce_budget(self.tree, TIER, ByteBudget(max(0, held - short)), self.policy))
            self._unlink_doomed()
            free = shutil.disk_usage(self.dir).free
        if free - size < self.reserve_bytes:
            self.declined_low_space += 1
            self._space_low(f"{free >> 20} MiB free, below the {self.reserve_bytes >> 20} MiB reserve "
                            "(--cache-disk-reserve-mb)")
            return False
        if self._low_space:
            self._low_space = False
            log.info("disk cache: space is back in %s (%d MiB free); writing segments again", self.dir, free >> 20)
        return True

    def _write(self, tokens: list[int], ranges: list[tuple[int, KVSegment]]) -> None:
        """Write one file for the part of `tokens` past what the disk holds, if `ranges`
        cover it and the budget can make room for the whole file: decide under the lock,
        write without it, index under it."""
        have = self.held(tokens)
        seg = cover(ranges, have, len(tokens)) if have < len(tokens) else None
        if seg is None:
            return
        encoded = encode_segment(self.fingerprint, tokens, seg)
        if not self._room_on_disk(encoded.size):
            return
        with self._lock:
            room = self._make_room(encoded.size)
        if not room:  # pinned or locked files fill the budget: the disk keeps what it has
            self.declined += 1
            self._unlink_doomed()
            return
        file = write_segment_file(self.dir, encoded)
        with self._lock:
            self._place(tokens, file)
            if not self._make_room(0):  # room taken meanwhile (a restore locked what was to go)
                self._unplace(file)
                self.declined += 1
        self._unlink_doomed()

    def _unplace(self, file: SegmentFile) -> None:
        """Take the unlocked ranges of a just-written file back out of the index (caller
        holds the lock); the file goes when no node uses it."""
        for node in [n for n in self.tree.nodes() if TIER in n.values and n.values[TIER].file is file]:
            if node.lock_ref == 0:
                self._release(self.tree.remove_value(node, TIER))

    def wait_idle(self) -> None:
        """Block until every queued segment is written (tests, benchmarks, shutdown)."""
        self._writer.wait_idle()

    def flush(self) -> int:
        self.wait_idle()
        with self._lock:
            res = self.tree.flush(TIER, self.policy)
            self._released(res)
        self._unlink_doomed()
        return res.freed_bytes

    def close(self) -> None:
        self._writer.close(timeout=30)

    def stats(self) -> dict:
        """Counters, read without the tree's lock (a scrape never waits for the cache)."""
        c = self.tree.counters(TIER)
        return {"entries": c.n_payloads, "files": len(c.memory), "tokens": c.payload_tokens, "bytes": c.total_bytes,
                "held_bytes": c.held_bytes, "budget_bytes": self.budget_bytes, "declined": self.declined,
                "reserve_bytes": self.reserve_bytes, "declined_low_space": self.declined_low_space,
                "no_space_errors": self.no_space_errors,
                "pending_bytes": self._writer.pending_bytes, "queue_bytes": self.queue_bytes,
                "dropped_writes": self.dropped_writes,
                "hits": self.hits, "evictions": self.evictions,
                "skipped_files": self.skipped_files, "corrupt_files": self.corrupt_files,
                "foreign_files": self.foreign_files, "write_errors": self.write_errors,
                "pending_writes": self._writer.pending}
