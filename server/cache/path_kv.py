"""The KV a stored tier keeps a token path from (`PathKV`, server/cache/tiers.py): read off the
device as the tier asks for it (`DeviceKV`), or held in memory already (`HeldKV`: the values of
the tier above, or ranges a test or benchmark made).

Write-back (server/cache/write_back_policy.py) offers the first stored tier the device's
cells; that tier (H) hands each tier below it its own values on the path, so the device is
read once and only for what H lacked. Without H, D reads the device itself, again only what
it lacks.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

from server.cache.kv_format import KVSegment, cut
from server.cache.tiers import PathKV

if TYPE_CHECKING:
    from server.cache.checkpoints import StateCheckpoint
    from server.cache.radix_node import RadixNode

Ranges = list[tuple[int, KVSegment]]  # (path position, segment) pairs in path order


def no_checkpoints(align: int) -> list[StateCheckpoint]:
    return []


class DeviceKV:
    """A path's KV in a sequence's cells: `extract(start, end)` copies positions [start, end)
    off the device now (KVOps.extract; it raises ExtractError), so a tier reads only what it
    lacks, and must read before the cells are dropped. `checkpoints(align)`: the path's state
    checkpoints kept at multiples of `align` (CheckpointStore.on_path), if any."""

    reads_device = True
    tip: RadixNode | None = None  # the device's cells are not on the tree

    def __init__(self, extract: Callable[[int, int], KVSegment],
                 checkpoints: Callable[[int], list[StateCheckpoint]] = no_checkpoints,
                 tag: Callable[[RadixNode], None] | None = None, sessions: tuple[str, ...] = ()):
        self.extract = extract
        self.checkpoints = checkpoints
        self.tag, self.sessions = tag, sessions

    def read(self, start: int, end: int) -> Ranges:
        """One range, [start, end), read now."""
        return [(start, self.extract(start, end))]


class HeldKV:
    """A path's KV held in memory as (position, segment) ranges (views: reading copies
    nothing). `ranges` is the list, or a function that makes it, called at the first read
    only (the host tier's values on the path, read under its tree's lock), so a path no tier
    below asks for costs no walk."""

    reads_device = False

    def __init__(self, ranges: Ranges | Callable[[], Ranges], tip: RadixNode | None = None,
                 checkpoints: Callable[[int], list[StateCheckpoint]] = no_checkpoints,
                 tag: Callable[[RadixNode], None] | None = None, sessions: tuple[str, ...] = ()):
        self._ranges: Ranges | None = ranges if isinstance(ranges, list) else None
        self._make: Callable[[], Ranges] | None = None if isinstance(ranges, list) else ranges
        self.tip = tip
        self.checkpoints = checkpoints
        self.tag, self.sessions = tag, sessions

    def read(self, start: int, end: int) -> Ranges:
        """Every range held (the receiving tier cuts [start, end) out of them when it writes)."""
        if self._ranges is None:
            assert self._make is not None  # one of the two is given
            self._ranges = self._make()
        return self._ranges


def one_segment(kv: PathKV, start: int, end: int) -> KVSegment:
    """Positions [start, end) of `kv` as one segment: the range it read when that is exactly
    it (a device read: no further copy), else cut out of its ranges and joined (a copy)."""
    parts = cut(kv.read(start, end), start, end)
    if parts is None:
        raise ValueError(f"the path's KV does not cover positions [{start}, {end})")
    return KVSegment.join(parts)
