"""Host buffers kept for the states that staged restores join (server/cache/kv_ops.py, `joined`).

A joined state of tens of MiB in fresh memory costs a page fault per 4 KiB page on its first touch: measured here, a
1,600-token state of the embedded model (37 MB) took 55-120 ms to join into a fresh buffer and 3-8 ms into one
touched before. A restore staged beside the compute waits for its join, so the joins take a buffer an earlier join
used, once its write is done.

Contract: thread-safe. `take(n)` gives a uint8 array of exactly n bytes, a view of a kept buffer at least that large
(the smallest that fits) or of a new one; `give(array)` returns it once nothing reads it any more (its write is done,
or it was never staged); one never given back is freed as any array is. At most `keep_bytes` stay kept (the largest
go first); a buffer is never kept twice.
"""

from __future__ import annotations

import threading

import numpy as np

KEEP_BYTES = 256 * 1024 * 1024


class StagingBuffers:
    def __init__(self, keep_bytes: int = KEEP_BYTES):
        self.keep_bytes = keep_bytes
        self._free: list[np.ndarray] = []  # whole buffers, smallest first
        self._lock = threading.Lock()
        self.reused = self.allocated = 0

    def take(self, nbytes: int) -> np.ndarray:
        with self._lock:
            for i, buf in enumerate(self._free):
                if buf.nbytes >= nbytes:
                    del self._free[i]
                    self.reused += 1
                    return buf[:nbytes]
            self.allocated += 1
        return np.empty(nbytes, dtype=np.uint8)

    def give(self, view: np.ndarray) -> None:
        whole = view.base if isinstance(view.base, np.ndarray) else view
        with self._lock:
            if any(b is whole for b in self._free):
                return
            self._free.append(whole)
            self._free.sort(key=lambda b: b.nbytes)
            while self._free and sum(b.nbytes for b in self._free) > self.keep_bytes:
                self._free.pop()  # the largest

    def kept_bytes(self) -> int:
        with self._lock:
            return sum(b.nbytes for b in self._free)
