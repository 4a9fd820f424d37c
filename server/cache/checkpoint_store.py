"""State checkpoints in host RAM, by the token prefix they follow: what tiers H and D need, besides
their full-attention segments, to restore a prefix on a model with sliding-window or recurrent
layers (server/cache/checkpoints.py).

A stored tier holds a model's full-attention KV for [0, m) of a prompt; a restore there also
needs the state the full-attention KV cannot give at the end of what is restored. So the prefix
a stored tier can serve is the longest prompt[:p], p <= m, for which a checkpoint is kept here,
and it is restored as that tier's segments of [0, p) plus this checkpoint.

Keys are a digest of the prefix's tokens (BLAKE2b of their int32 bytes, and of the cache namespace
when the tokens are a namespace's cache key: server/engine/cache_namespace.py), so a checkpoint is
only ever found for exactly the tokens it followed, in the namespace it followed them in, whichever
slot took it. Lookup digests the prompt at the few positions checkpoints exist at, longest first.

Contracts: `put(tokens, ckpt)` keeps ckpt for tokens[:ckpt.pos] (a newer one for the same prefix
replaces it), evicting the least recently used beyond `budget_bytes` (a checkpoint larger than
the budget is declined, counted); `best(prompt, limit)` the checkpoint with the highest
position <= limit whose prefix is prompt's (a hit refreshes it). Thread-safe (one lock): the
engine thread writes and plans; stats are read from the HTTP thread. With tier D (`files`), every
checkpoint is also written to disk (server/cache/checkpoint_files.py): `put` only queues it for
a writer thread (a few MB at a slot's write-back, never written by the engine thread; a full
queue drops the disk copy, counted, and the RAM copy stays), a lookup reaching one still queued
gets it from the queue, and one a previous run left is read back when a lookup reaches it: D's
segments restore after a restart. `clear()` (RAM only) first waits for the queued writes, and
`close()` (server shutdown) writes them, then stops the writer.
"""

from __future__ import annotations

import hashlib
import threading
from collections import OrderedDict
from collections.abc import Sequence

import numpy as np

from server.cache.checkpoint_files import CheckpointFiles
from server.cache.checkpoints import StateCheckpoint
from server.engine.cache_namespace import split


def prefix_digest(tokens: Sequence[int], n: int) -> bytes:
    namespace, ids = split(tokens[:n])
    h = hashlib.blake2b(np.asarray(ids, dtype=np.int32).tobytes(), digest_size=16)
    if namespace is not None:
        h.update(b"|namespace|" + namespace)
    return h.digest()


class CheckpointStore:
    def __init__(self, budget_bytes: int, files: CheckpointFiles | None = None):
        self.budget_bytes = budget_bytes
        self._by_key: OrderedDict[bytes, StateCheckpoint] = OrderedDict()  # least recently used first
        self._positions: dict[int, int] = {}  # position -> checkpoints kept at it
        self._lock = threading.Lock()
        self.bytes = 0
        self.stored = self.hits = self.evictions = self.declined = self.disk_hits = 0
        # with tier D: every checkpoint also on disk (server/cache/checkpoint_files.py), so D's segments
        # still restore after a restart; what a previous run left is indexed, read when asked for
        self.files = files
        self._on_disk: dict[bytes, int] = dict(files.index()) if files is not None else {}
        self._disk_positions: dict[int, int] = {}
        for pos in self._on_disk.values():
            self._disk_positions[pos] = self._disk_positions.get(pos, 0) + 1

    def __len__(self) -> int:
        return len(self._by_key)

    def put(self, tokens: Sequence[int], ckpt: StateCheckpoint) -> bool:
        if ckpt.pos <= 0 or ckpt.pos > len(tokens):
            raise ValueError(f"a checkpoint at {ckpt.pos} does not follow a prefix of {len(tokens)} tokens")
        if ckpt.nbytes > self.budget_bytes:
            self.declined += 1
            return False
        key = prefix_digest(tokens, ckpt.pos)
        with self._lock:
            self._keep(key, ckpt)
            self.stored += 1
            if self.files is not None and self.files.write(key, ckpt):  # queued: found from now on
                if key not in self._on_disk:
                    self._on_disk[key] = ckpt.pos
                    self._disk_positions[ckpt.pos] = self._disk_positions.get(ckpt.pos, 0) + 1
        return True

    def _keep(self, key: bytes, ckpt: StateCheckpoint) -> None:
        self._drop(key)
        while self._by_key and self.bytes + ckpt.nbytes > self.budget_bytes:
            self._drop(next(iter(self._by_key)))
            self.evictions += 1
        self._by_key[key] = ckpt
        self._positions[ckpt.pos] = self._positions.get(ckpt.pos, 0) + 1
        self.bytes += ckpt.nbytes

    def best(self, prompt: Sequence[int], limit: int) -> StateCheckpoint | None:
        with self._lock:
            positions = {*self._positions, *self._disk_positions}
            for pos in sorted((p for p in positions if p <= min(limit, len(prompt))), reverse=True):
                key = prefix_digest(prompt, pos)
                found = self._by_key.get(key)
                if found is not None:
                    self._by_key.move_to_end(key)
                    self.hits += 1
                    return found
                if key in self._on_disk and self.files is not None:
                    found = self.files.read(key)
                    if found is None or found.pos != pos:
                        if found is not None:  # another prefix's state under this digest: never to be used
                            self.files.discard(key)
                        self._forget_file(key)
                        continue
                    if found.nbytes <= self.budget_bytes:
                        self._keep(key, found)
                    self.hits += 1
                    self.disk_hits += 1
                    return found
        return None

    def on_path(self, tokens: Sequence[int], multiple: int) -> list[StateCheckpoint]:
        """The checkpoints kept in RAM for prefixes of `tokens` at positions that are multiples
        of `multiple` (what the shared store can key: its chunk boundaries)."""
        with self._lock:
            positions = sorted(p for p in self._positions if p % multiple == 0 and p <= len(tokens))
            found = (self._by_key.get(prefix_digest(tokens, p)) for p in positions)
            return [c for c in found if c is not None]

    def _forget_file(self, key: bytes) -> None:
        pos = self._on_disk.pop(key, None)
        if pos is not None:
            left = self._disk_positions[pos] - 1
            if left:
                self._disk_positions[pos] = left
            else:
                del self._disk_positions[pos]

    def clear(self) -> int:
        """Forget the checkpoints in RAM (their files stay); the disk writes queued before it are done first."""
        if self.files is not None:
            self.files.wait_idle()
        with self._lock:
            freed = self.bytes
            self._by_key.clear()
            self._positions.clear()
            self.bytes = 0
            return freed

    def _drop(self, key: bytes) -> None:
        old = self._by_key.pop(key, None)
        if old is None:
            return
        self.bytes -= old.nbytes
        left = self._positions[old.pos] - 1
        if left:
            self._positions[old.pos] = left
        else:
            del self._positions[old.pos]

    def flush_writes(self) -> None:
        """Wait until every checkpoint queued for disk is written (tests, benchmarks)."""
        if self.files is not None:
            self.files.wait_idle()

    def close(self) -> None:
        """Server shutdown: write what is queued for disk, then stop the writer."""
        if self.files is not None:
            self.files.close()

    def stats(self) -> dict:
        return {"entries": len(self._by_key), "bytes": self.bytes, "budget_bytes": self.budget_bytes,
                "stored": self.stored, "hits": self.hits, "evictions": self.evictions, "declined": self.declined,
                **({"disk": {**self.files.stats(), "hits": self.disk_hits}} if self.files is not None else {})}
