"""Tier D: KV segments in files, surviving restarts.

One file per radix segment: a JSON header (format version, model fingerprint, the full
token path up to the segment's end, where the segment starts, its KV layout, the SHA-256
of the body) and the raw K/V rows. Files are written atomically (temp file + rename) by a
writer thread, so storing never waits on the disk. At start the directory is indexed
from the headers alone; a file of another model, an unreadable header or a body whose
checksum fails is skipped with a log line and never loaded. Bodies are read and checked
when a request restores them.
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
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from server.cache.eviction import EvictionPolicy
from server.cache.host_tier import TierMatch
from server.cache.kv_format import KVLayout, KVSegment
from server.cache.radix_tree import RadixNode, RadixTree

log = logging.getLogger(__name__)

MAGIC = b"ARBORKV1"
SUFFIX = ".kvseg"


class DiskSegmentError(RuntimeError):
    """A segment file is missing, corrupt or of another model."""


@dataclass
class DiskSegment:
    """Payload of a disk-tree node: the file holding the KV of tokens[start:] of `tokens`."""

    path: Path
    tokens: list[int]  # the full token path up to the segment's end
    start: int
    size: int
    fingerprint: str

    @property
    def n_tokens(self) -> int:
        return len(self.tokens) - self.start

    @property
    def nbytes(self) -> int:
        return self.size

    def split(self, offset: int) -> tuple[DiskSegment, DiskSegment]:
        """Rewrite as two files (the tree splits an edge when a new path leaves it midway)."""
        seg = read_segment_file(self.path, self.fingerprint)
        left, right = seg.split(offset)
        directory = self.path.parent
        a = write_segment_file(directory, self.fingerprint, self.tokens[: self.start + offset], left)
        b = write_segment_file(directory, self.fingerprint, self.tokens, right)
        self.path.unlink(missing_ok=True)
        return a, b


def _layout_to_json(layout: KVLayout) -> dict:
    return {k: (list(v) if isinstance(v, tuple) else v) for k, v in layout.__dict__.items()}


def _layout_from_json(d: dict) -> KVLayout:
    return KVLayout(bool(d["v_trans"]), *(tuple(d[k]) for k in ("k_types", "k_row_bytes", "v_types",
                                                                   "v_row_bytes", "v_el_bytes")))


def write_segment_file(directory: Path, fingerprint: str, path_tokens: list[int], seg: KVSegment) -> DiskSegment:
    body = b"".join(np.ascontiguousarray(a).tobytes() for a in seg.k + seg.v)
    header = json.dumps({
        "version": 1, "fingerprint": fingerprint, "tokens": path_tokens, "start": seg.pos0, "n": seg.n_tokens,
        "layout": _layout_to_json(seg.layout), "sha256": hashlib.sha256(body).hexdigest(),
    }).encode()
    final = directory / f"{uuid.uuid4().hex}{SUFFIX}"
    tmp = final.with_suffix(".tmp")
    with open(tmp, "wb") as f:
        f.write(MAGIC + struct.pack("<I", len(header)) + header + body)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, final)
    return DiskSegment(final, list(path_tokens), seg.pos0, final.stat().st_size, fingerprint)


def read_header(path: Path) -> tuple[dict, int]:
    with open(path, "rb") as f:
        head = f.read(len(MAGIC) + 4)
        if len(head) < len(MAGIC) + 4 or head[: len(MAGIC)] != MAGIC:
            raise DiskSegmentError(f"{path.name}: not an Arbor KV segment file")
        (hlen,) = struct.unpack("<I", head[len(MAGIC):])
        try:
            header = json.loads(f.read(hlen))
        except (json.JSONDecodeError, UnicodeDecodeError) as exc:
            raise DiskSegmentError(f"{path.name}: unreadable header") from exc
    return header, len(MAGIC) + 4 + hlen


def read_segment_file(path: Path, fingerprint: str) -> KVSegment:
    try:
        header, offset = read_header(path)
        data = path.read_bytes()[offset:]
    except OSError as exc:
        raise DiskSegmentError(f"{path.name}: {exc}") from exc
    if header.get("fingerprint") != fingerprint:
        raise DiskSegmentError(f"{path.name}: written for another model or KV layout")
    if hashlib.sha256(data).hexdigest() != header.get("sha256"):
        raise DiskSegmentError(f"{path.name}: checksum mismatch (corrupt file)")
    layout = _layout_from_json(header["layout"])
    n = header["n"]
    arrays, off = [], 0
    for row in list(layout.k_row_bytes) + list(layout.v_row_bytes):
        size = n * row
        if off + size > len(data):
            raise DiskSegmentError(f"{path.name}: body shorter than its header says")
        arrays.append(np.frombuffer(data, dtype=np.uint8, count=size, offset=off).reshape(n, row))
        off += size
    nl = layout.n_layer
    return KVSegment(layout, header["start"], arrays[:nl], arrays[nl:])


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
        parts.append(seg.slice(pos - start, min(e, end) - start))
        pos = min(e, end)
        if pos == e:
            return KVSegment.join(parts)
    return None


class DiskTier:
    name = "D"

    def __init__(self, directory: Path, budget_bytes: int, fingerprint: str, policy: EvictionPolicy):
        self.dir = directory
        self.dir.mkdir(parents=True, exist_ok=True)
        self.budget_bytes = budget_bytes
        self.fingerprint = fingerprint
        self.policy = policy
        self.tree = RadixTree(on_evict=self._delete_file)
        self._lock = threading.Lock()
        self._queue: queue.Queue = queue.Queue()
        self.hits = 0
        self.evictions = 0
        self.skipped_files = 0
        self.write_errors = 0
        self._load_index()
        self._writer = threading.Thread(target=self._write_loop, name="arbor-disk-writer", daemon=True)
        self._writer.start()

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
                entries.append((start, tokens, DiskSegment(path, tokens, start, path.stat().st_size, self.fingerprint)))
            except (DiskSegmentError, OSError, KeyError, TypeError, ValueError) as exc:
                self.skipped_files += 1
                log.warning("disk cache: %s", exc)
        for start, tokens, seg in sorted(entries, key=lambda e: (e[0], len(e[1]))):
            self._insert_segment(tokens, seg)
        if entries:
            log.info("disk cache: indexed %d segments (%d skipped) from %s", len(entries), self.skipped_files, self.dir)

    def _insert_segment(self, tokens: list[int], seg: DiskSegment) -> None:
        """Index a file found at start: its range becomes a node (a hole stands for a
        missing parent, so the path is usable only up to it). A file whose range the tree
        cannot hold exactly is deleted."""
        if seg.start > 0:
            self.tree.insert(tokens[: seg.start])
        placed = False

        def give(s: int, e: int):
            nonlocal placed
            if (s, e) == (seg.start, len(tokens)):
                placed = True
                return seg
            return None

        self.tree.insert(tokens, give)
        if not placed:
            seg.path.unlink(missing_ok=True)

    # ------------------------------------------------------------------ match
    def match(self, tokens: list[int]) -> tuple[int, list[tuple[RadixNode, int]]]:
        """Longest prefix held on disk: (length, [(node, tokens used from it)]). The last
        node may be used only partly (the prefix ends inside its edge)."""
        with self._lock:
            m = self.tree.match_prefix(tokens, require_payload=True, touch=True)
            used = [(n, len(n.key)) for n in m.path]
            if m.partial_node is not None and m.partial_node.payload is not None and m.partial_tokens > 0:
                used.append((m.partial_node, m.partial_tokens))
            return m.length + (m.partial_tokens if len(used) > len(m.path) else 0), used

    def load(self, used: list[tuple[RadixNode, int]]) -> TierMatch:
        """Read and check the files of a matched path; a bad file is dropped from the index."""
        segments = []
        for node, n in used:
            seg: DiskSegment = node.payload
            try:
                kv = read_segment_file(seg.path, self.fingerprint)
            except DiskSegmentError as exc:
                log.warning("disk cache: %s; dropped", exc)
                with self._lock:
                    if node.attached and node.lock_ref == 0 and node.payload is seg:
                        self.tree.remove_payload(node)
                        seg.path.unlink(missing_ok=True)
                raise
            segments.append(kv if n == kv.n_tokens else kv.slice(0, n))
        return TierMatch(sum(s.n_tokens for s in segments), segments, used[-1][0] if used else None)

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
        """Write a file for each range of `tokens` the disk tree lacks and `ranges` covers."""

        def payload_for(s: int, e: int) -> DiskSegment | None:
            seg = _cover(ranges, s, e)
            return None if seg is None else write_segment_file(self.dir, self.fingerprint, tokens[:e], seg)

        with self._lock:
            self.tree.insert(tokens, payload_for)
            self._enforce_budget()

    def _enforce_budget(self) -> None:
        over = self.tree.total_bytes - self.budget_bytes
        if over > 0:
            res = self.tree.evict(over, self.policy)
            self.evictions += len(res.freed_nodes)

    def _delete_file(self, node: RadixNode) -> None:
        if isinstance(node.payload, DiskSegment):
            node.payload.path.unlink(missing_ok=True)

    def wait_idle(self) -> None:
        """Block until every queued segment is written (tests, benchmarks, shutdown)."""
        self._queue.join()

    def flush(self) -> int:
        self.wait_idle()
        with self._lock:
            res = self.tree.flush(self.policy)
            self.evictions += len(res.freed_nodes)
            return res.freed_bytes

    def close(self) -> None:
        self._queue.put(None)
        self._writer.join(timeout=30)

    def stats(self) -> dict:
        with self._lock:
            s = self.tree.stats()
        return {"entries": s.n_payloads, "tokens": s.payload_tokens, "bytes": s.total_bytes,
                "budget_bytes": self.budget_bytes, "hits": self.hits, "evictions": self.evictions,
                "skipped_files": self.skipped_files, "write_errors": self.write_errors,
                "pending_writes": self._queue.qsize()}
