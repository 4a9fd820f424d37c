"""What every stored tier of the prefix cache is to the router: one interface, one name.

The sources of reusable KV (docs/architecture.md, one request's path) are named by `Source` and by nothing
else; its values are the letters /cache/stats and /metrics have always shown. The stored
tiers, host RAM (H, server/cache/host_tier.py), disk (D, server/cache/disk_tier.py) and the
store shared by replicas (R, server/cache/shared_tier.py), implement `KVTier`, and their
callers hold them as one collection ordered as `STORED` (fastest first) and go through it:

- `lookup(tokens, walk)`: how far the tier holds `tokens` (a match whose `length` is that
  many leading tokens). H and D answer from `walk`, the one walk of the radix tree they share
  (the caller holds `tree.mutex`); R asks its store (a round trip, bounded in time).
- `load(match, start)`: the KV of positions [start, match.length) as consecutive segments,
  checked; raises the tier's error (a RestoreError, DiskSegmentError or SharedTierError),
  which the router turns into computing the prompt. H answers from memory; D and R read, so
  the router runs their loads on its I/O threads (`READ_AHEAD`).
- `store(tokens, kv)`: keep what the tier lacks of the path `tokens`, reading its KV from
  `kv` (a `PathKV`: the device's cells, or the values of the tier above; server/cache/
  path_kv.py); never waits on I/O (D and R queue for a writer thread, bounded in bytes).
  Returns the path's KV as the tier now holds it, for the tiers below it to store from, or
  None when it has none to give (declined, dropped, or queued for a writer: D and R).
- `evict(nbytes)`: drop at least `nbytes` of the tier's KV by its eviction policy, if the
  locks and pins allow (R: nothing, the store's own LRU bounds it); the bytes freed.
- `flush()`: drop what the tier may drop (locked and pinned KV stays); the bytes freed.
- `stats()`: its counters, read without any lock the engine thread holds.
- `close()`: finish its writes (after the engine stopped).

Each tier keeps its own counters: `hits` counts the loads it served (the router no longer
bumps a tier's counters).

The device sources (A: the slot's own KV; S: cells another sequence holds, resident owners
in server/cache/resident.py) are not stored tiers: the router attaches or keeps their cells.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from enum import StrEnum
from typing import TYPE_CHECKING, Any, Protocol, runtime_checkable

if TYPE_CHECKING:
    from server.cache.checkpoints import StateCheckpoint
    from server.cache.kv_format import KVSegment
    from server.cache.radix_node import RadixNode


class Source(StrEnum):
    """Where a request's reused prefix comes from; ties are broken in this order."""

    A = "A"  # the slot's own kept KV
    S = "S"  # cells another sequence holds (a resident owner, another slot, a parked copy)
    H = "H"  # host RAM
    D = "D"  # disk
    R = "R"  # the store shared by replicas


STORED = (Source.H, Source.D, Source.R)  # restored from a copy (the rest is attached or kept), fastest first
READ_AHEAD = (Source.D, Source.R)  # read on an I/O thread while the request waits
ON_TREE = (Source.S, Source.H, Source.D)  # recorded on the radix tree's nodes (R's store changes under it)
STORED_ON_TREE = (Source.H, Source.D)  # this replica's own copies: on its tree, in its budgets


@runtime_checkable
class PathKV(Protocol):
    """The KV of a token path, offered to a tier's `store` by whoever holds it."""

    # Each read copies KV off the device, now: a tier reads only what it lacks. Otherwise the
    # KV is held in memory already (views): a tier reads it all and cuts what it needs later.
    reads_device: bool
    tip: RadixNode | None  # the radix tree node the path ends at, where the giver keeps it there
    # Tags a stored path with the sessions that use it (SessionRegistry.tag): a tier on the tree calls it with the
    # path's tip under the tree's lock as soon as it has inserted the path, before it makes room, so the policy
    # values the new path by its sessions from the start (untagged, it is worth 0 and the first to go). None: no one.
    tag: Callable[[RadixNode], None] | None
    # The sessions that use the path (those `tag` tags it with): a tier whose policy values sessions admits the path
    # only by evicting what that policy ranks below it (server/cache/host_tier.py).
    sessions: tuple[str, ...]

    def read(self, start: int, end: int) -> list[tuple[int, KVSegment]]:
        """(path position, segment) pairs in path order covering [start, end) as far as the
        giver holds it; they may cover more (the receiving tier cuts them)."""
        ...

    def checkpoints(self, align: int) -> list[StateCheckpoint]:
        """The path's state checkpoints at multiples of `align` (a model with sliding-window or
        recurrent layers; none otherwise)."""
        ...


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

    def store(self, tokens: list[int], kv: PathKV) -> PathKV | None:
        """Keep what the tier lacks of the path `tokens`, read from `kv`; never waits on I/O.
        The path's KV as the tier now holds it (for the tiers below), or None."""
        ...

    def evict(self, nbytes: int) -> int:
        """Drop at least `nbytes` by the tier's policy, as far as locks and pins allow; the bytes freed."""
        ...

    def flush(self) -> int:
        """Drop what may be dropped; the bytes freed."""
        ...

    def stats(self) -> dict:
        """Counters, read without the engine's locks."""
        ...

    def close(self) -> None:
        """Finish the tier's writes (after the engine stopped)."""
        ...


def tier_of(tiers: Iterable[KVTier], source: Source) -> Any:
    """The tier of `tiers` named `source`, or None (typed loosely: its caller wants the
    tier-specific class, e.g. the host tier's KV size per token)."""
    return next((t for t in tiers if t.source is source), None)
