"""Tier D: KV segments in files, surviving restarts.

One file per stored range: a JSON header (format version, model fingerprint, the full
token path up to the range's end, where the range starts, its KV layout, the SHA-256 of
the body) and the raw K/V arrays in llama.cpp's own layout (written from the segment's
views, read back into one buffer and viewed, never copied byte by byte). Files are
written atomically (temp file + rename) by a writer thread, so storing never waits on the
disk, and the tree lock is never held during file I/O: the writer decides what is
missing under the lock, writes the file without it, then indexes it under the lock. A
tree node holds a `DiskSegment`, a token range of one file; splitting a node splits the
range (no I/O) and a file is deleted when no node refers to it any more. At start the
directory is indexed from the headers alone; a file of another model, an unreadable
header or a body whose checksum fails is skipped with a log line and never loaded.
Bodies are read and checked when a request restores them, while the request holds a lock
reference on the matched path, and each read range must start where the match says.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import queue
import struct
import threading
import uuid
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from server.cache.eviction import EvictionPolicy
from server.cache.host_tier import TierMatch
from server.cache.kv_format import KVLayout, KVSegment, segment_from_arrays
from server.cache.radix_tree import RadixNode, RadixTree

log = logging.getLogger(__name__)

MAGIC = b"ARBORKV2"
SUFFIX = ".kvseg"


class DiskSegmentError(RuntimeError):
    """A segment file is missing, corrupt or of another model."""


@dataclass(eq=False)
class SegmentFile:
    """One file on disk: the KV of positions [start, start + n); `refs` nodes use it."""

    path: Path
    start: int
    n: int
    size: int
    refs: int = 0


@dataclass(eq=False)
class DiskSegment:
    """Payload of a disk-tree node: positions [start, end) of one segment file."""

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

    def split(self, offset: int) -> tuple[DiskSegment, DiskSegment]:
        """Two ranges of the same file (no I/O): the file now has one more user."""
        self.file.refs += 1
        return DiskSegment(self.file, self.start, self.start + offset), DiskSegment(self.file, self.start + offset,
                                                                                    self.end)


def _layout_to_json(layout: KVLayout) -> dict:
    return {k: (list(v) if isinstance(v, tuple) else v) for k, v in layout.__dict__.items()}


def _layout_from_json(d: dict) -> KVLayout:
    return KVLayout(bool(d["v_trans"]), *(tuple(d[k]) for k in ("k_types", "k_row_bytes", "v_types",
                                                                   "v_row_bytes", "v_el_bytes")))


def write_segment_file(directory: Path, fingerprint: str, path_tokens: list[int], seg: KVSegment) -> SegmentFile:
    """Write `seg` (the KV of path_tokens[seg.pos0:]) atomically; the arrays go to the file
    from their own memory (a transposed-V slice is made contiguous first)."""
    arrays = [np.ascontiguousarray(a) for a in seg.arrays()]
    digest = hashlib.sha256()
    for a in arrays:
        digest.update(a.data)
    header = json.dumps({
        "version": 2, "fingerprint": fingerprint, "tokens": list(path_tokens), "start": seg.pos0, "n": seg.n_tokens,
        "layout": _layout_to_json(seg.layout), "sha256": digest.hexdigest(),
    }).encode()
    final = directory / f"{uuid.uuid4().hex}{SUFFIX}"
    tmp = final.with_suffix(".tmp")
    with open(tmp, "wb") as f:
        f.write(MAGIC + struct.pack("<I", len(header)) + header)
        for a in arrays:
            f.write(a.data)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, final)
    return SegmentFile(final, seg.pos0, seg.n_tokens, final.stat().st_size)


def read_header(path: Path) -> tuple[dict, int]:
    with open(path, "rb") as f:
        head = f.read(len(MAGIC) + 4)
        if len(head) < len(MAGIC) + 4 or head[: len(MAGIC)] != MAGIC:
            raise DiskSegmentError(f"{path.name}: not an Arbor KV segment file (of this version)")
        (hlen,) = struct.unpack("<I", head[len(MAGIC):])
        try:
            header = json.loads(f.read(hlen))
        except (json.JSONDecodeError, UnicodeDecodeError) as exc:
            raise DiskSegmentError(f"{path.name}: unreadable header") from exc
    return header, len(MAGIC) + 4 + hlen


def read_segment_file(path: Path, fingerprint: str) -> KVSegment:
    """The whole file's segment, checked: one read into one buffer, arrays are views."""
    try:
        header, offset = read_header(path)
        with open(path, "rb") as f:
            f.seek(offset)
            body = bytearray(os.fstat(f.fileno()).st_size - offset)
            got = f.readinto(body)
    except OSError as exc:
        raise DiskSegmentError(f"{path.name}: {exc}") from exc
    if header.get("fingerprint") != fingerprint:
        raise DiskSegmentError(f"{path.name}: written for another model or KV layout")
    if got != len(body) or hashlib.sha256(body).hexdigest() != header.get("sha256"):
        raise DiskSegmentError(f"{path.name}: checksum mismatch (corrupt file)")
    layout = _layout_from_json(header["layout"])
    if len(body) != header["n"] * layout.bytes_per_token:
        raise DiskSegmentError(f"{path.name}: body size does not match its header")
    return segment_from_arrays(layout, header["start"], header["n"], body)


def read_segment(seg: DiskSegment, fingerprint: str) -> KVSegment:
    """The KV of a node's range (a slice of its file's segment)."""
    kv = read_segment_file(seg.file.path, fingerprint)
    if kv.pos0 != seg.file.start or kv.n_tokens != seg.file.n:
        raise DiskSegmentError(f"{seg.file.path.name}: holds other positions than indexed")
    if (seg.start, seg.end) == (seg.file.start, seg.file.start + seg.file.n):
        return kv
    return kv.slice(seg.start - kv.pos0, seg.end - kv.pos0)


def _cover(ranges: list[tuple[int, KVSegment]], s: int, e: int) -> KVSegment | None:
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
    name = "D"

    def __init__(self, directory: Path, budget_bytes: int, fingerprint: str, policy: EvictionPolicy):
        self.dir = directory
        self.dir.mkdir(parents=True, exist_ok=True)
        self.budget_bytes = budget_bytes
        self.fingerprint = fingerprint
        self.policy = policy
        self.tree = RadixTree(on_evict=lambda node: self._release(node.payload))
        self._lock = threading.Lock()
        self._doomed: list[Path] = []  # files no node uses any more; unlinked outside the lock
        self._queue: queue.Queue = queue.Queue()
        self.hits = 0
        self.evictions = 0
        self.skipped_files = 0
        self.write_errors = 0
        self._load_index()
        self._writer = threading.Thread(target=self._write_loop, name="arbor-disk-writer", daemon=True)
        self._writer.start()

    # ------------------------------------------------------------------ files
    def _use(self, file: SegmentFile, s: int, e: int) -> DiskSegment:
        file.refs += 1
        return DiskSegment(file, s, e)

    def _release(self, seg: DiskSegment | None) -> None:
        """A node dropped its range (caller holds the lock or owns the tree alone)."""
        if isinstance(seg, DiskSegment) and not seg.released:
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

        self.tree.insert(tokens[:end], give)
        if file.refs == 0:
            self._doomed.append(file.path)

    # ------------------------------------------------------------------ index
    def _load_index(self) -> None:
        for tmp in self.dir.glob("*.tmp"):
            tmp.unlink(missing_ok=True)  # a write that never finished
        entries = []
        for path in self.dir.glob(f"*{SUFFIX}"):
            try:
                header, _ = read_header(path)
                if header.get("fingerprint") != self.fingerprint:
                    raise DiskSegmentError(f"{path.name}: written for another model or KV layout, skipped")
                start, n, tokens = int(header["start"]), int(header["n"]), list(header["tokens"])
                if start + n != len(tokens) or n <= 0:
                    raise DiskSegmentError(f"{path.name}: inconsistent header, skipped")
                entries.append((tokens, SegmentFile(path, start, n, path.stat().st_size)))
            except (DiskSegmentError, OSError, KeyError, TypeError, ValueError) as exc:
                self.skipped_files += 1
                log.warning("disk cache: %s", exc)
        for tokens, file in sorted(entries, key=lambda e: (e[1].start, len(e[0]))):
            if file.start > 0:
                self.tree.insert(tokens[: file.start])  # a hole until its parent's file is placed
            self._place(tokens, file)
        self._unlink_doomed()
        if entries:
            log.info("disk cache: indexed %d segments (%d skipped) from %s", len(entries), self.skipped_files, self.dir)

    # ------------------------------------------------------------------ match
    def match(self, tokens: list[int]) -> DiskMatch:
        """Longest prefix held on disk (the last range may be used only partly)."""
        with self._lock:
            m = self.tree.match_prefix(tokens, require_payload=True, touch=True)
            parts = [(n.payload, len(n.key)) for n in m.path]
            node = m.path[-1] if m.path else None
            if m.partial_node is not None and m.partial_node.payload is not None and m.partial_tokens > 0:
                parts.append((m.partial_node.payload, m.partial_tokens))
                node = m.partial_node
            return DiskMatch(sum(n for _, n in parts), parts, node)

    def held(self, tokens: list[int]) -> int:
        return self.match(tokens).length

    def load(self, match: DiskMatch) -> TierMatch:
        """Read and check the files of a match, holding a lock reference on its path so the
        writer cannot evict it meanwhile; every range must start where the previous ended
        (a split or a stale match is refused, never restored at the wrong position). A bad
        file is dropped from the index."""
        if match.node is None:
            return TierMatch(0, [], None)
        with self._lock:
            if not match.node.attached:
                raise DiskSegmentError("the matched segments were evicted before they were read")
            self.tree.lock(match.node)
        bad: SegmentFile | None = None
        try:
            segments, pos = [], 0
            for seg, n in match.parts:
                if seg.start != pos or n > seg.n_tokens:
                    raise DiskSegmentError(f"segment range [{seg.start}, {seg.end}) does not continue at {pos}")
                try:
                    kv = read_segment(seg, self.fingerprint)
                except DiskSegmentError as exc:
                    log.warning("disk cache: %s; dropped", exc)
                    bad = seg.file
                    raise
                if kv.pos0 != pos:
                    raise DiskSegmentError(f"{seg.file.path.name}: starts at {kv.pos0}, expected {pos}")
                segments.append(kv if n == kv.n_tokens else kv.slice(0, n))
                pos += n
        finally:
            with self._lock:
                self.tree.unlock(match.node)
            if bad is not None:
                self._drop_file(bad)
            self._unlink_doomed()
        return TierMatch(pos, segments, match.node)

    def _drop_file(self, file: SegmentFile) -> None:
        """Take every unlocked range of a bad file out of the index (a range another
        request holds locked goes at its own failed read or at eviction)."""
        with self._lock:
            for node in [n for n in self.tree.nodes() if isinstance(n.payload, DiskSegment) and n.payload.file is file]:
                if node.lock_ref == 0:
                    self._release(self.tree.remove_payload(node))

    # ------------------------------------------------------------------ store
    def store(self, tokens: list[int], ranges: list[tuple[int, KVSegment]]) -> None:
        """Queue the path `tokens` for writing; `ranges` are (start, segment) pairs covering
        as much of it as the caller holds. Only what the disk tree lacks is written."""
        self._queue.put((list(tokens), ranges))

    def _write_loop(self) -> None:
        while True:
            item = self._queue.get()
            if item is None:
                self._queue.task_done()
                return
            tokens, ranges = item
            try:
                self._write(tokens, ranges)
            except Exception:
                self.write_errors += 1
                log.exception("disk cache: writing segments failed")
            finally:
                self._queue.task_done()

    def _write(self, tokens: list[int], ranges: list[tuple[int, KVSegment]]) -> None:
        """Write one file for the part of `tokens` past what the disk holds, if `ranges`
        cover it: decide under the lock, write without it, index under it."""
        have = self.held(tokens)
        seg = _cover(ranges, have, len(tokens)) if have < len(tokens) else None
        if seg is None:
            return
        file = write_segment_file(self.dir, self.fingerprint, tokens, seg)
        with self._lock:
            self._place(tokens, file)
            over = self.tree.total_bytes - self.budget_bytes
            if over > 0:
                self.evictions += len(self.tree.evict(over, self.policy).freed_nodes)
        self._unlink_doomed()

    def wait_idle(self) -> None:
        """Block until every queued segment is written (tests, benchmarks, shutdown)."""
        self._queue.join()

    def flush(self) -> int:
        self.wait_idle()
        with self._lock:
            res = self.tree.flush(self.policy)
            self.evictions += len(res.freed_nodes)
        self._unlink_doomed()
        return res.freed_bytes

    def close(self) -> None:
        self._queue.put(None)
        self._writer.join(timeout=30)

    def stats(self) -> dict:
        with self._lock:
            s = self.tree.stats()
            # nodes split from one write share its file, so files <= entries; every file the
            # index uses should exist on disk, and no other file should
            files = len({n.payload.file.path for n in self.tree.nodes() if isinstance(n.payload, DiskSegment)})
        return {"entries": s.n_payloads, "files": files, "tokens": s.payload_tokens, "bytes": s.total_bytes,
                "budget_bytes": self.budget_bytes, "hits": self.hits, "evictions": self.evictions,
                "skipped_files": self.skipped_files, "write_errors": self.write_errors,
                "pending_writes": self._queue.qsize()}
