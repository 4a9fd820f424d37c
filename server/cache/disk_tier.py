"""Tier D: KV segments in files, surviving restarts (and crashes).

One file per stored range, in the `.kvseg` format (server/cache/segment_format.py: a
checksummed header saying which model and which token path the KV belongs to, then the raw
K/V arrays), which the shared tier uses for its values too.

Crash safety: files are written to a temp name, fsynced, renamed (`os.replace`) and the
directory fsynced (so the rename itself survives a power loss), so a process killed mid-write
leaves only a `*.tmp` file, which the next start deletes; a write that fails (ENOSPC, EIO, a
quota) deletes its temp file at once; a `.kvseg` name always means a complete write. Nothing
is trusted for that alone: at start the directory is indexed from the headers (checksummed)
and the file sizes (a truncated body is caught without reading it); the body checksum is
verified when a request restores the file, while it holds a lock reference on the matched
path, and each read range must start where the match says and the header must be the one
indexed. Every file that fails is skipped with a log line and counted: `corrupt_files` (torn,
truncated, garbage, a checksum mismatch) and `foreign_files` (another model, KV layout or
format version; left on disk, never loaded). A restore that fails falls back to computing
the prompt (server/cache/restore.py), so a bad file costs time, never an answer.

Free space (server/cache/disk_space.py): a write that would leave less than `reserve_bytes`
free first evicts this tier's own files (by the policy; pinned and locked ones stay), else is
declined and counted, as is one that fails for lack of space; requests go on without D.

The index is the D values of the radix tree shared with tier H (server/cache/
radix_tree.py): a node's D value is a `DiskSegment`, a token range of one file; splitting
a node (by either tier) splits the range (no I/O) and a file is deleted when no node
refers to it any more. Evicting D values never drops a node's H value, and the D budget
counts the files D values use, each whole (a file stays until its last range goes); a
write that the budget cannot make room for (pinned or locked files) is refused. Files are
written by a writer thread whose queue is bounded in bytes (server/cache/bounded_writer.py: a
full queue drops the store, counted), so storing never waits on the disk, and the tree lock is
never held during file I/O: the writer decides what is missing under the lock, writes the file
without it, then indexes it under the lock. A store takes the path's KV as a `PathKV` (server/
cache/path_kv.py): H's values on it (all of them: the writer cuts what it lacks), or, without
H, the device's cells, read at once for what the disk does not hold yet.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import cast

from server.cache.bounded_writer import BoundedWriter
from server.cache.budget import BudgetResult, ByteBudget, enforce_budget
from server.cache.disk_space import DiskSpace
from server.cache.eviction import EvictionPolicy
from server.cache.kv_format import KVSegment, cut
from server.cache.radix_tree import EvictResult, MatchResult, RadixNode, RadixTree
from server.cache.segment_format import (
    MAGIC,  # noqa: F401 - re-exported: tests and benchmarks name the format through the tier
    SUFFIX,
    CorruptSegmentFile,
    DiskSegmentError,
    ForeignSegmentFile,
    SegmentFile,
    check_header,
    encode_segment,
    read_header,
    read_ranges,
    read_segment_file,  # noqa: F401 - re-exported, as MAGIC
    write_segment_file,
)
from server.cache.tiers import PathKV, Source

log = logging.getLogger(__name__)

TIER = Source.D
DEFAULT_QUEUE_BYTES = 64 << 20  # KV waiting for the writer: past it, stores are dropped


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


@dataclass(frozen=True)
class DiskMatch:
    """A prefix held on disk: `length` tokens from the ranges in `parts` (in path order;
    the last may be used only partly), found under the lock; `node` is the deepest node used."""

    length: int
    parts: list[tuple[DiskSegment, int]]
    node: RadixNode | None


class DiskTier:
    """A `KVTier` (server/cache/tiers.py)."""

    source = TIER

    def __init__(self, tree: RadixTree, directory: Path, budget_bytes: int, fingerprint: str,
                 policy: EvictionPolicy, queue_bytes: int = DEFAULT_QUEUE_BYTES, reserve_bytes: int = 0,
                 streams: int = 1):
        """`reserve_bytes`: free space the filesystem must keep after a write; a write that
        would go below it is declined (counted), see the module's "Free space". `streams`: the KV
        streams of the context restores go to (the split layout's: a state is read from the files
        straight into one for it; the files themselves are the same in every layout)."""
        self.streams = streams
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
        self.space = DiskSpace(directory, reserve_bytes)
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

    def _place(self, tokens: list[int], file: SegmentFile) -> RadixNode:
        """Index `file` (the KV of tokens[file.start:]): it serves any range of it that the
        tree lacks (caller holds the lock); unused, it is deleted. Returns the path's tip."""
        end = file.start + file.n

        def give(s: int, e: int) -> DiskSegment | None:
            return self._use(file, s, e) if file.start <= s and e <= end else None

        tip = self.tree.insert(tokens[:end], TIER, give).last_node
        if file.refs == 0:
            self._doomed.append(file.path)
        return tip

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
                tokens, _ = check_header(path.name, header, self.fingerprint, size, offset)
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
            self._release(cast(DiskSegment, seg))

    # ------------------------------------------------------------------ match
    def take(self, m: MatchResult) -> DiskMatch:
        """What D holds of a match of the shared tree (caller holds the lock); the last
        range may be used only partly."""
        span = m.span(TIER)
        parts = [(cast(DiskSegment, n.values[TIER]), len(n.key)) for n in span.nodes]
        node = span.tip
        if span.partial_node is not None:
            parts.append((cast(DiskSegment, span.partial_node.values[TIER]), span.partial_tokens))
            node = span.partial_node
        return DiskMatch(span.longest, parts, node)

    def match(self, tokens: list[int]) -> DiskMatch:
        """Longest prefix held on disk."""
        with self._lock:
            return self.take(self.tree.match_prefix(tokens))

    def lookup(self, tokens: list[int], walk: MatchResult | None = None) -> DiskMatch:
        """What D holds of `tokens`, from `walk` (under the lock) when given."""
        return self.take(walk) if walk is not None else self.match(tokens)

    def held(self, tokens: list[int]) -> int:
        return self.match(tokens).length

    def load(self, match: DiskMatch, start: int = 0) -> list[KVSegment]:
        """Read and check the files of a match from path position `start` on (what a slot
        does not hold already), as one segment ready for llama.cpp; each file is read once.
        Holds a lock reference on the path meanwhile so the writer cannot evict it; every
        range must start where the previous ended (a split or a stale match is refused,
        never restored at the wrong position). A bad file is dropped from the index.
        Safe on any thread (the I/O thread reads ahead of the engine)."""
        if match.node is None or start >= match.length:
            return []
        with self._lock:
            # Evicting D values leaves a node attached while it holds H: check the values.
            if not match.node.attached or any(TIER not in n.values for n in match.node.iter_up()):
                raise DiskSegmentError("the matched segments were evicted before they were read")
            self.tree.lock(match.node)
        bad: SegmentFile | None = None
        try:
            ranges = self._ranges(match, start)
            try:
                kv = read_ranges(ranges, self.fingerprint, self.streams)
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
        self.hits += 1
        return [kv]

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
    def store(self, tokens: list[int], kv: PathKV) -> None:
        """Queue the path `tokens` for writing, with its KV read from `kv`: all it holds, or,
        when reading copies it off the device, only what the disk lacks (read now). Only what
        the tree holds no D value for is written. Never waits: when the queue already holds
        `queue_bytes` of KV (the disk is slower than the stores), the write is dropped
        (counted), since queued ranges keep host memory alive outside every budget. Returns
        None: the file is written later, there is nothing to hand on."""
        start = self.held(tokens) if kv.reads_device else 0
        if start < len(tokens):
            ranges = kv.read(start, len(tokens))
            self._writer.submit((list(tokens), ranges, kv.tag), sum(seg.nbytes for _, seg in ranges))

    @property
    def dropped_writes(self) -> int:
        """Stores dropped because the queue was full."""
        return self._writer.dropped

    def _write_failed(self, exc: Exception) -> None:
        self.write_errors += 1
        if not self.space.failed(exc):
            log.error("disk cache: writing segments failed: %s", exc, exc_info=exc)

    def evict(self, nbytes: int) -> int:
        """Drop files holding at least `nbytes` by the policy (pinned and locked ones stay, so
        it may free less: the low-space path, see "Free space"); the bytes of the values freed."""
        with self._lock:
            held = self.tree.tier(TIER).held_bytes
            res = enforce_budget(self.tree, TIER, ByteBudget(max(0, held - nbytes)), self.policy)
            self._released(res)
        self._unlink_doomed()
        return res.freed_bytes

    def _write(self, tokens: list[int], ranges: list[tuple[int, KVSegment]],
               tag: Callable[[RadixNode], None] | None = None) -> None:
        """Write one file for the part of `tokens` past what the disk holds, if `ranges`
        cover it and the budget can make room for the whole file: decide under the lock,
        write without it, index under it (the path tagged with `tag` first: PathKV.tag)."""
        have = self.held(tokens)
        parts = cut(ranges, have, len(tokens)) if have < len(tokens) else None
        seg = KVSegment.join(parts) if parts else None
        if seg is None:
            return
        encoded = encode_segment(self.fingerprint, tokens, seg)
        if not self.space.room_for(encoded.size, self.evict):
            return
        with self._lock:
            room = self._make_room(encoded.size)
        # The evicted files go before the new one is written: the files on disk, not only
        # the index, stay within the budget at every moment.
        self._unlink_doomed()
        if not room:  # pinned or locked files fill the budget: the disk keeps what it has
            self.declined += 1
            return
        file = write_segment_file(self.dir, encoded)
        with self._lock:
            tip = self._place(tokens, file)
            if tag is not None and tip.attached:
                tag(tip)
            if not self._make_room(0):  # room taken meanwhile (a restore locked what was to go)
                self._unplace(file)
                self.declined += 1
        self._unlink_doomed()

    def _unplace(self, file: SegmentFile) -> None:
        """Take the unlocked ranges of a just-written file back out of the index (caller
        holds the lock); the file goes when no node uses it."""
        for node in [n for n in self.tree.nodes()
                     if TIER in n.values and cast(DiskSegment, n.values[TIER]).file is file]:
            if node.lock_ref == 0:
                self._release(cast("DiskSegment | None", self.tree.remove_value(node, TIER)))

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
                "reserve_bytes": self.space.reserve_bytes, "declined_low_space": self.space.declined_low_space,
                "no_space_errors": self.space.no_space_errors,
                "pending_bytes": self._writer.pending_bytes, "queue_bytes": self.queue_bytes,
                "dropped_writes": self.dropped_writes,
                "hits": self.hits, "evictions": self.evictions,
                "skipped_files": self.skipped_files, "corrupt_files": self.corrupt_files,
                "foreign_files": self.foreign_files, "write_errors": self.write_errors,
                "pending_writes": self._writer.pending}
