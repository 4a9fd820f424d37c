"""State checkpoints on disk, beside tier D's segment files: what lets D restore a sliding-window
or hybrid model's prefix after a restart (server/cache/checkpoint_store.py keeps them in RAM).

One file per checkpoint, `<cache dir>/checkpoints/<prefix digest>.ckpt`: a header line of JSON
(`magic`, the model fingerprint D's files carry, `pos`, the blob's length and SHA-256), then the
blob (llama.cpp's PARTIAL_ONLY sequence state). Written to a temporary name, fsynced, renamed and
the directory fsynced, so a crash leaves either the whole file or none (and a temporary file,
deleted at the next start).

Writes never wait for the disk: `write` queues the checkpoint for a writer thread whose queue is
bounded in bytes (server/cache/bounded_writer.py, as tier D's segments; a few MB a checkpoint on
a sliding-window model, which the engine thread used to write and fsync itself at a slot's
write-back). A checkpoint still queued is served from the queue by `read`, so it is never missed
while on its way; when the queue is full the write is dropped and counted (the caller's RAM copy
stays). Renames and deletions happen under one lock, and a write only renames its file if it is
still the one queued for its digest: a checkpoint deleted, or replaced by a newer one, while
queued or being written never comes back as a file.

Contracts: `write(digest, ckpt)` queues it, never blocking (False: not queued — larger than the
budget, the queue full (`dropped_writes`), or closed); once written, the oldest files beyond
`budget_bytes` are deleted. `index()` lists what a previous run left, by digest, without reading
the blobs; `read(digest)` returns the checkpoint (a queued one from the queue), or None when the
file is gone, of another model (fingerprint) or damaged (then deleted). `discard(digest)` deletes
it, queued or written. `wait_idle()` returns when every write queued before it is done (written,
failed or superseded); `close()` does the same, then stops the thread (later writes are refused).
I/O errors are logged and counted, never raised: a missing checkpoint costs compute, never a request.
"""

from __future__ import annotations

import hashlib
import itertools
import json
import logging
import os
import threading
from pathlib import Path

from server.cache.bounded_writer import BoundedWriter
from server.cache.checkpoints import StateCheckpoint
from server.cache.segment_format import fsync_directory

log = logging.getLogger(__name__)

MAGIC = "arbor-checkpoint-1"
SUFFIX = ".ckpt"
DEFAULT_QUEUE_BYTES = 64 << 20  # checkpoint bytes waiting for the writer: past it, writes are dropped


class CheckpointFiles:
    def __init__(self, directory: Path, fingerprint: str, budget_bytes: int,
                 queue_bytes: int = DEFAULT_QUEUE_BYTES):
        self.dir = directory
        self.dir.mkdir(parents=True, exist_ok=True)
        for tmp in self.dir.glob("*.tmp"):  # a write the process died in (as D's segment files)
            log.info("checkpoint file %s is an unfinished write (the process stopped while writing it); deleted",
                     tmp.name)
            tmp.unlink(missing_ok=True)
        self.fingerprint, self.budget_bytes, self.queue_bytes = fingerprint, budget_bytes, queue_bytes
        self._lock = threading.Lock()  # _sizes, _pending, counters, and every rename or unlink
        self._sizes: dict[bytes, int] = {}  # digest -> file size, oldest first (insertion order)
        self._pending: dict[bytes, tuple[int, StateCheckpoint]] = {}  # digest -> (ticket, checkpoint) queued
        self._tickets = itertools.count(1)
        self._closed = False
        self.errors = self.dropped = self.queued_reads = 0
        for digest, _pos, _mtime, size in sorted(self._scan(), key=lambda e: e[2]):  # oldest first
            self._sizes[digest] = size
        self._writer = BoundedWriter("arbor-checkpoint-writer", lambda item: self._write(*item),
                                     self._write_failed, queue_bytes)

    def _path(self, digest: bytes) -> Path:
        return self.dir / f"{digest.hex()}{SUFFIX}"

    def _scan(self) -> list[tuple[bytes, int, int, int]]:
        """(digest, position, mtime, size) of this model's checkpoint files."""
        out = []
        for path in self.dir.glob(f"*{SUFFIX}"):
            try:
                with path.open("rb") as f:
                    head = json.loads(f.readline())
                if head.get("magic") != MAGIC or head.get("fingerprint") != self.fingerprint:
                    continue  # another model's (or format's): left for it
                st = path.stat()
                out.append((bytes.fromhex(path.stem), int(head["pos"]), st.st_mtime_ns, st.st_size))
            except (OSError, ValueError, KeyError) as exc:
                log.warning("checkpoint file %s unreadable (%s): ignored", path.name, exc)
        return out

    def index(self) -> list[tuple[bytes, int]]:
        """(digest, position) of every checkpoint of this model on disk."""
        return [(d, p) for d, p, _, _ in self._scan()]

    # ------------------------------------------------------------------ writing (the writer thread)
    def write(self, digest: bytes, ckpt: StateCheckpoint) -> bool:
        """Queue ckpt for the writer thread; never waits. A newer write for the same digest
        supersedes one still queued."""
        if ckpt.nbytes > self.budget_bytes:
            return False
        with self._lock:  # the writer reads _pending under it: it sees this entry before the item
            if self._closed:
                return False
            ticket = next(self._tickets)
            if not self._writer.submit((digest, ticket, ckpt), ckpt.nbytes):
                return False
            self._pending[digest] = (ticket, ckpt)
        return True

    def _current(self, digest: bytes, ticket: int) -> bool:
        """Whether `ticket` is still the write queued for digest (caller holds the lock)."""
        queued = self._pending.get(digest)
        return queued is not None and queued[0] == ticket

    def _write(self, digest: bytes, ticket: int, ckpt: StateCheckpoint) -> None:
        try:
            self._write_file(digest, ticket, ckpt)
        finally:
            with self._lock:  # failed, declined or done: no longer queued
                if self._current(digest, ticket):
                    del self._pending[digest]

    def _write_file(self, digest: bytes, ticket: int, ckpt: StateCheckpoint) -> None:
        with self._lock:
            if not self._current(digest, ticket):
                return  # deleted, or a newer checkpoint for the same prefix is queued
        head = json.dumps({"magic": MAGIC, "fingerprint": self.fingerprint, "pos": ckpt.pos, "bytes": ckpt.nbytes,
                           "sha256": hashlib.sha256(ckpt.blob).hexdigest()}).encode() + b"\n"
        size = len(head) + ckpt.nbytes
        if size > self.budget_bytes:
            return
        path = self._path(digest)
        tmp = self.dir / f"{digest.hex()}.{ticket}.tmp"
        try:
            self._write_tmp(tmp, head, ckpt.blob)
            with self._lock:
                if not self._current(digest, ticket):  # deleted or superseded while being written
                    tmp.unlink(missing_ok=True)
                    return
                os.replace(tmp, path)
                del self._pending[digest]
                self._sizes.pop(digest, None)
                self._sizes[digest] = size
                while sum(self._sizes.values()) > self.budget_bytes and len(self._sizes) > 1:
                    self._drop(next(iter(self._sizes)))
        except OSError as exc:
            with self._lock:
                self.errors += 1
            log.warning("checkpoint file %s not written: %s", path.name, exc)
            tmp.unlink(missing_ok=True)
            return
        try:
            fsync_directory(self.dir)  # the rename (and the deletions) survive a power loss
        except OSError as exc:
            log.warning("checkpoint directory not synced: %s", exc)

    @staticmethod
    def _write_tmp(tmp: Path, head: bytes, blob: bytes) -> None:
        with tmp.open("wb") as f:
            f.write(head)
            f.write(blob)
            f.flush()
            os.fsync(f.fileno())

    def _write_failed(self, exc: Exception) -> None:
        with self._lock:
            self.errors += 1
        log.error("checkpoint files: a write failed: %s", exc, exc_info=exc)

    def wait_idle(self) -> None:
        """Block until every write queued so far is done (tests, benchmarks, flush, shutdown)."""
        self._writer.wait_idle()

    def close(self, timeout: float = 30.0) -> None:
        """Write what is queued (up to `timeout` seconds), then stop the writer; later writes are refused."""
        with self._lock:
            if self._closed:
                return
            self._closed = True
        self._writer.close(timeout=timeout)

    # ------------------------------------------------------------------ reading, deleting
    def read(self, digest: bytes) -> StateCheckpoint | None:
        with self._lock:
            queued = self._pending.get(digest)
            if queued is not None:  # not on disk yet: the queue holds it
                self.queued_reads += 1
                return queued[1]
            return self._read_file(digest)

    def _read_file(self, digest: bytes) -> StateCheckpoint | None:
        path = self._path(digest)
        try:
            data = path.read_bytes()
        except FileNotFoundError:
            self._sizes.pop(digest, None)
            return None
        except OSError as exc:
            self.errors += 1
            log.warning("checkpoint file %s not read: %s", path.name, exc)
            return None
        try:
            cut = data.index(b"\n")
            head, blob = json.loads(data[:cut]), data[cut + 1:]
            ok = (head.get("magic") == MAGIC and head.get("fingerprint") == self.fingerprint
                  and len(blob) == head["bytes"] and hashlib.sha256(blob).hexdigest() == head["sha256"])
        except (ValueError, KeyError):
            ok = False
        if not ok:
            log.warning("checkpoint file %s is damaged or not this model's: deleted", path.name)
            self._drop(digest)
            return None
        return StateCheckpoint(int(head["pos"]), blob)

    def discard(self, digest: bytes) -> None:
        """Delete the checkpoint: its file, and its write if still queued (it is then never written)."""
        with self._lock:
            self._pending.pop(digest, None)
            self._sizes.pop(digest, None)
            try:
                self._path(digest).unlink(missing_ok=True)
            except OSError as exc:
                self.errors += 1
                log.warning("checkpoint file %s not deleted: %s", self._path(digest).name, exc)

    def _drop(self, digest: bytes) -> None:
        """Delete a file (caller holds the lock): beyond the budget, or damaged."""
        self._sizes.pop(digest, None)
        self._path(digest).unlink(missing_ok=True)
        self.dropped += 1

    def stats(self) -> dict:
        with self._lock:
            return {"files": len(self._sizes), "bytes": sum(self._sizes.values()), "budget_bytes": self.budget_bytes,
                    "errors": self.errors, "dropped": self.dropped,
                    "pending_writes": len(self._pending), "pending_bytes": self._writer.pending_bytes,
                    "queue_bytes": self.queue_bytes, "dropped_writes": self._writer.dropped,
                    "queued_reads": self.queued_reads}
