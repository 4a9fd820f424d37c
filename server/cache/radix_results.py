"""What the radix tree (server/cache/radix_tree.py) answers: its errors, a match's spans per tier, an insert's and an
eviction's results, and its per-tier byte counters. Plain data, no tree logic."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from server.cache.radix_node import RadixNode, SegmentPayload
from server.cache.tiers import Source


def _allocation_bytes(memory: Any, payload: SegmentPayload) -> int:  # memory: a buffer with nbytes
    return payload.nbytes if memory is payload else memory.nbytes


class RadixTreeError(Exception):
    """Base class of errors raised by the radix tree on misuse."""


class NodeLockedError(RadixTreeError):
    """The operation would remove or alter a node that a reader has locked."""


class DetachedNodeError(RadixTreeError):
    """The node is no longer in the tree (it was pruned)."""


class PayloadSizeError(RadixTreeError, ValueError):
    """A payload does not cover exactly its node's token range."""


class TreeInvariantError(AssertionError):
    """``check_invariants`` found the tree inconsistent (a bug, never user input)."""


@dataclass(frozen=True)
class TierSpan:
    """How far a matched prefix is available in one tier.

    ``nodes`` are the whole nodes from the root that all hold a value in the
    tier (``length`` tokens); the prefix may continue ``partial_tokens`` into
    ``partial_node``'s value (usable as a slice of it, or after a split).
    """

    tier: str
    length: int
    nodes: tuple[RadixNode, ...]
    partial_node: RadixNode | None = None
    partial_tokens: int = 0

    @property
    def longest(self) -> int:
        return self.length + self.partial_tokens

    @property
    def tip(self) -> RadixNode | None:
        """The deepest whole node of the span, or None when it is empty."""
        return self.nodes[-1] if self.nodes else None


@dataclass(frozen=True)
class MatchResult:
    """Longest prefix of a token sequence present in the tree as structure.

    ``length`` tokens are covered by the whole nodes in ``path`` (root
    excluded; ``last_node`` is the deepest of them, or the root).  The match
    may continue ``partial_tokens`` tokens into ``partial_node``'s edge.
    ``span(tier)`` says how much of it a tier can serve.
    """

    length: int
    path: tuple[RadixNode, ...]
    last_node: RadixNode
    partial_node: RadixNode | None = None
    partial_tokens: int = 0

    @property
    def longest(self) -> int:
        """Tokens matched including the partial overlap into the next edge."""
        return self.length + self.partial_tokens

    def span(self, tier: str) -> TierSpan:
        """The part of this match held in ``tier``: whole nodes until the first
        without a value there, then the partial edge if it has one."""
        return self._span(tier, lambda node: tier in node.values)

    def held_span(self) -> TierSpan:
        """The part of this match in device cells: any holder of its deepest node
        (``partial_node`` or ``tip``) holds all of it (tier ``Source.S``)."""
        return self._span(Source.S, lambda node: bool(node.holders))

    def _span(self, tier: str, has: Callable[[RadixNode], bool]) -> TierSpan:
        n = 0
        length = 0
        while n < len(self.path) and has(self.path[n]):
            length += len(self.path[n].key)
            n += 1
        if n == len(self.path) and self.partial_node is not None and has(self.partial_node):
            return TierSpan(tier, length, self.path, self.partial_node, self.partial_tokens)
        return TierSpan(tier, length, self.path[:n])


@dataclass(frozen=True)
class InsertResult:
    """What ``insert`` changed.

    ``prefix_len`` tokens were already present as tree structure; the new
    suffix (if any) is the single node in ``new_nodes``.  ``filled_nodes`` are
    existing nodes on the path that received a value in the inserted tier.
    ``last_node`` ends exactly at the inserted sequence's end (the tree splits
    an edge to make it so) and ``path`` is the whole path, root excluded.
    """

    prefix_len: int
    new_nodes: tuple[RadixNode, ...]
    filled_nodes: tuple[RadixNode, ...]
    last_node: RadixNode
    path: tuple[RadixNode, ...]


@dataclass(frozen=True)
class EvictResult:
    """What ``evict``/``flush`` took out of one tier, in eviction order.

    ``freed`` pairs each node with the value it lost (the caller releases it:
    RAM, a file reference); the node stays attached while it still indexes
    something (another tier's value, children).  ``freed_bytes`` may fall
    short of ``requested_bytes`` when not enough is evictable (``satisfied``).
    """

    tier: str
    requested_bytes: int | None
    freed: tuple[tuple[RadixNode, SegmentPayload], ...]
    freed_bytes: int
    freed_tokens: int

    @property
    def satisfied(self) -> bool:
        return self.requested_bytes is None or self.freed_bytes >= self.requested_bytes


@dataclass(eq=False)
class MemoryUse:
    """The nodes whose values in one tier keep one allocation alive, and how many of its
    bytes they still use (``live_bytes`` < ``memory.nbytes`` once parts were evicted)."""

    memory: object
    nodes: set = field(default_factory=set)
    live_bytes: int = 0

    def __eq__(self, other: object) -> bool:
        return (isinstance(other, MemoryUse) and self.memory is other.memory and self.nodes == other.nodes
                and self.live_bytes == other.live_bytes)


@dataclass
class TierCounters:
    """One tier's totals, kept incrementally (for budgets, /cache/stats and metrics).

    ``total_bytes`` counts the values' own sizes; ``held_bytes`` what they really keep
    alive: each allocation they use, once and whole (a budget is on ``held_bytes``)."""

    n_payloads: int = 0
    payload_tokens: int = 0
    evictable_bytes: int = 0
    protected_bytes: int = 0
    held_bytes: int = 0
    memory: dict[int, MemoryUse] = field(default_factory=dict)  # id(allocation) -> its users

    @property
    def total_bytes(self) -> int:
        return self.evictable_bytes + self.protected_bytes

    def use(self, node: RadixNode, payload: SegmentPayload, sign: int) -> None:
        memory = getattr(payload, "memory", None) or payload
        key = id(memory)
        entry = self.memory.get(key)
        if sign > 0:
            if entry is None:
                entry = self.memory[key] = MemoryUse(memory)
                self.held_bytes += _allocation_bytes(memory, payload)
            entry.nodes.add(node)
            entry.live_bytes += payload.nbytes
            return
        assert entry is not None, "releasing a value that was never counted"
        entry.nodes.discard(node)
        entry.live_bytes -= payload.nbytes
        if not entry.nodes:
            del self.memory[key]
            self.held_bytes -= _allocation_bytes(memory, payload)
