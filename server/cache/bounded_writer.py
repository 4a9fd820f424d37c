"""A writer thread fed by a queue bounded in bytes: how tiers D and R store without waiting.

`submit(item, nbytes)` never blocks the caller (the engine thread): when the queue already
holds `max_bytes` of KV, the item is dropped and counted (`dropped`), since what waits in the
queue keeps host memory alive outside every budget. One item larger than the bound is still
taken when the queue is empty, so a bound below one store does not stop every write. The
thread calls `write(item)` for each item in order; an exception goes to `on_error` and the
thread goes on.
"""

from __future__ import annotations

import queue
import threading
from collections.abc import Callable
from typing import Any


class BoundedWriter:
    def __init__(self, name: str, write: Callable[[Any], None], on_error: Callable[[Exception], None],
                 max_bytes: int):
        self.max_bytes = max_bytes
        self.dropped = 0
        self._write = write
        self._on_error = on_error
        self._queued_bytes = 0
        self._guard = threading.Lock()
        self._queue: queue.Queue = queue.Queue()
        self._thread = threading.Thread(target=self._loop, name=name, daemon=True)
        self._thread.start()

    @property
    def pending_bytes(self) -> int:
        return self._queued_bytes

    @property
    def pending(self) -> int:
        return self._queue.qsize()

    def submit(self, item: Any, nbytes: int) -> bool:
        """Queue `item` (holding `nbytes` of KV); False, counted, when the queue is full."""
        with self._guard:
            if self._queued_bytes and self._queued_bytes + nbytes > self.max_bytes:
                self.dropped += 1
                return False
            self._queued_bytes += nbytes
        self._queue.put((item, nbytes))
        return True

    def wait_idle(self) -> None:
        """Block until every queued item is written (tests, benchmarks, flush, shutdown)."""
        self._queue.join()

    def close(self, timeout: float) -> None:
        self._queue.put(None)
        self._thread.join(timeout=timeout)

    def _loop(self) -> None:
        while True:
            entry = self._queue.get()
            if entry is None:
                self._queue.task_done()
                return
            item, nbytes = entry
            try:
                self._write(item)
            except Exception as exc:  # noqa: BLE001 - a lost write costs the cache only
                self._on_error(exc)
            finally:
                with self._guard:
                    self._queued_bytes -= nbytes
                self._queue.task_done()
