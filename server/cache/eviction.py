"""Eviction policies and per-tier byte budgets for the radix tree.

A policy is a small object whose ``priority(node)`` gives the sort key of a
node whose value in the tier being evicted may go: the smallest key is
evicted first, None means "not now" (the tree skips the node).  Keys of one policy must be mutually comparable.
The tree computes keys when a node becomes a candidate within one ``evict``
call, so a policy must not depend on state that changes during eviction.
"""

from __future__ import annotations

from collections.abc import Callable, Hashable
from dataclasses import dataclass
from enum import IntEnum
from typing import TYPE_CHECKING, Protocol

if TYPE_CHECKING:
    from server.cache.lifecycle import SessionRegistry
    from server.cache.radix_tree import RadixNode, RadixTree


class EvictionPolicy(Protocol):
    name: str

    def priority(self, node: RadixNode) -> Hashable | None:
        """Sort key (smaller = evicted sooner), or None to keep ``node`` for now."""
        ...


class LRUPolicy:
    """Least recently used first (the default without hints)."""

    name = "lru"

    def priority(self, node: RadixNode) -> tuple[float]:
        return (node.last_access,)


class LifecycleClass(IntEnum):
    """Eviction tiers of LifecyclePolicy, evicted in increasing order."""

    DONE = 0  # every session through the node has finished
    NORMAL = 1  # no hints, or an active session
    TOOL_WAIT = 2  # a session waits on a tool and will come back soon


class LifecyclePolicy:
    """Seed 003's lifecycle-aware order: finished sessions first, tool waits last.

    A node is ranked by the states of the sessions whose paths pass through it
    (``RadixNode.sessions``, kept by ``SessionRegistry``): pinned -> never
    evicted while pinned; any ``tool_wait`` -> last; all ``done`` -> first;
    otherwise (active, or no known session) -> in between.  LRU within a class.
    Tags propagate to ancestors, so a pinned or tool-waiting tip protects its
    whole path; in each tier a parent is only a candidate once its children
    hold nothing there.  One policy serves every tier of the one tree.
    """

    name = "lifecycle"

    def __init__(self, registry: SessionRegistry) -> None:
        self.registry = registry

    def classify(self, node: RadixNode) -> LifecycleClass | None:
        """The node's eviction class, or None when a pinned session holds it."""
        if self.registry.is_node_pinned(node):
            return None
        states = self.registry.states_of(node)
        if "tool_wait" in states:
            return LifecycleClass.TOOL_WAIT
        if states and all(s == "done" for s in states):
            return LifecycleClass.DONE
        return LifecycleClass.NORMAL

    def priority(self, node: RadixNode) -> tuple[int, float] | None:
        cls = self.classify(node)
        return None if cls is None else (int(cls), node.last_access)


@dataclass(frozen=True)
class ByteBudget:
    """A byte limit for one tier; ``over_by`` says how much to evict to respect it."""

    limit_bytes: int

    def __post_init__(self) -> None:
        if self.limit_bytes < 0:
            raise ValueError(f"limit_bytes must be >= 0, got {self.limit_bytes}")

    def over_by(self, used_bytes: int, incoming_bytes: int = 0) -> int:
        """Bytes to free so that ``used + incoming`` fits (0 when it already does)."""
        return max(0, used_bytes + incoming_bytes - self.limit_bytes)


@dataclass(frozen=True)
class BudgetResult:
    """What ``enforce_budget`` evicted (node, value pairs in eviction order) and whether
    the tier now fits its budget with the incoming bytes."""

    freed: tuple
    freed_bytes: int
    satisfied: bool


def enforce_budget(
    tree: RadixTree,
    tier: str,
    budget: ByteBudget,
    policy: EvictionPolicy | None = None,
    incoming_bytes: int = 0,
    settle: Callable[[tuple], None] | None = None,
) -> BudgetResult:
    """Evict ``tier``'s values until what they keep alive plus ``incoming_bytes`` fits ``budget``.

    The tier is charged for its allocations, whole (``TierCounters.held_bytes``): a value
    that shares a buffer or a file with others frees nothing until the last of them goes,
    so eviction runs in rounds until the allocations fit; ``settle(freed)`` runs after each
    round (the host tier copies surviving slices out of mostly freed buffers). Only ``tier``'s values go (a node
    keeps what other tiers hold of it). Check ``satisfied``: locked or pinned nodes may
    leave the tier over budget, and the caller then declines to store the incoming payload.
    """
    counters = tree.tier(tier)
    freed: list = []
    freed_bytes = 0
    while True:
        over = budget.over_by(counters.held_bytes, incoming_bytes)
        if over == 0:
            return BudgetResult(tuple(freed), freed_bytes, True)
        res = tree.evict(over, tier, policy)
        if not res.freed:
            return BudgetResult(tuple(freed), freed_bytes, False)
        freed.extend(res.freed)
        freed_bytes += res.freed_bytes
        if settle is not None:
            settle(res.freed)
