"""One pool of llama.cpp sequence ids for slots, resident prefix owners and scratch work.

llama.cpp allows at most 256 sequences per context and the count is fixed when the
context is created, so every user of sequence ids draws from this pool, sized (and
checked) at start. Scratch ids must always be given back; `in_use` makes leaks visible.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass


class SequenceIdsExhausted(RuntimeError):
    """No sequence id of the requested kind is free."""


@dataclass(frozen=True)
class SequenceIdLayout:
    slots: int
    owners: int
    scratch: int
    parked: int = 0  # device copies waiting to be written back (server/cache/write_back.py)

    @property
    def total(self) -> int:
        return self.slots + self.owners + self.scratch + self.parked


class SequenceIdPool:
    def __init__(self, layout: SequenceIdLayout, max_total: int = 256):
        if layout.total > max_total:
            raise ValueError(
                f"{layout.slots} slots + {layout.owners} resident owners + {layout.scratch} scratch + "
                f"{layout.parked} parked sequences = "
                f"{layout.total} sequence ids; llama.cpp allows at most {max_total}"
            )
        self.layout = layout
        self.slot_ids = list(range(layout.slots))
        self._free = {
            "owner": list(range(layout.slots, layout.slots + layout.owners)),
            "scratch": list(range(layout.slots + layout.owners, layout.slots + layout.owners + layout.scratch)),
            "parked": list(range(layout.slots + layout.owners + layout.scratch, layout.total)),
        }
        self._used: dict[str, set[int]] = {"owner": set(), "scratch": set(), "parked": set()}
        self._lock = threading.Lock()

    def take(self, kind: str) -> int:
        with self._lock:
            if not self._free[kind]:
                raise SequenceIdsExhausted(f"no free {kind} sequence id (all {len(self._used[kind])} in use)")
            sid = self._free[kind].pop()
            self._used[kind].add(sid)
            return sid

    def give(self, kind: str, sid: int) -> None:
        with self._lock:
            self._used[kind].remove(sid)  # KeyError on a double give: a bug worth seeing
            self._free[kind].append(sid)

    def in_use(self, kind: str) -> int:
        with self._lock:
            return len(self._used[kind])
