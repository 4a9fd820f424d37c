"""What every stored tier of the prefix cache is to the router: one interface, one name.

The sources of reusable KV (DESIGN.md, the request path) are named by `Source`, not by string
literals; its values are the letters /cache/stats and /metrics have always shown. The stored
tiers, host RAM (H, server/cache/host_tier.py), disk (D, server/cache/disk_tier.py) and the
store shared by replicas (R, server/cache/shared_tier.py), implement `KVTier`:

- `lookup(tokens, walk)`: how far the tier holds `tokens` (a match whose `length` is that
  many leading tokens). H and D answer from `walk`, the one walk of the radix tree they share
  (the caller holds `tree.mutex`); R asks its store (a round trip, bounded in time).
- `load(match, start)`: the KV of positions [start, match.length) as consecutive segments,
  checked; raises the tier's error (a RestoreError, DiskSegmentError or SharedTierError),
  which the router turns into computing the prompt. H answers from memory; D and R read, so
  the router runs their loads on its I/O threads.
- `store(tokens, kv)`: keep what the tier lacks of the path `tokens`; never waits on I/O
  (D and R queue for a writer thread, bounded in bytes). H takes an extractor (it reads the
  device's KV only for the ranges it lacks), D and R take (start, segment) ranges (H's).
- `flush()`: drop what the tier may drop (locked and pinned KV stays); the bytes freed.
- `stats()`: its counters, read without any lock the engine thread holds.

Each tier keeps its own counters: `hits` counts the loads it served (the router no longer
bumps a tier's counters).

The device sources (A: the slot's own KV; S: cells another sequence holds, resident owners
in server/cache/resident.py) are not stored tiers: the router attaches or keeps their cells.
"""

from __future__ import annotations

from enum import StrEnum
from typing import Any, Protocol, runtime_checkable

from server.cache.kv_format import KVSegment


class Source(StrEnum):
    """Where a request's reused prefix comes from; ties are broken in this order."""

    A = "A"  # the slot's own kept KV
    S = "S"  # cells another sequence holds (a resident owner, another slot, a parked copy)
    H = "H"  # host RAM
    D = "D"  # disk
    R = "R"  # the store shared by replicas


STORED = (Source.H, Source.D, Source.R)  # restored from a copy (the rest is attached or kept)
READ_AHEAD = (Source.D, Source.R)  # read on an I/O thread while the request waits


@runtime_checkable
class KVTier(Protocol):
    source: Source
    hits: int

    def lookup(self, tokens: list[int], walk: Any = None) -> Any:
        """How far the tier holds `tokens`: a match with `length` (see the module docstring)."""
        ...

    def load(self, match: Any, start: int = 0) -> list[KVSegment]:
        """The KV of positions [start, match.length), consecutive segments, checked."""
        ...

    def store(self, tokens: list[int], kv: Any) -> object:
        """Keep what the tier lacks of the path `tokens`; never waits on I/O."""
        ...

    def flush(self) -> int:
        """Drop what may be dropped; the bytes freed."""
        ...

    def stats(self) -> dict:
        """Counters, read without the engine's locks."""
        ...
