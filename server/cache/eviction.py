"""Eviction policies and per-tier byte budgets for the radix tree.

A policy is a small object whose ``priority(node)`` gives the sort key of a
node whose value in the tier being evicted may go: the smallest key is
evicted first, None means "not now" (the tree skips the node).  Keys of one policy must be mutually comparable.
The tree computes keys when a node becomes a candidate within one ``evict``
call, so a policy must not depend on state that changes during eviction.
Byte budgets (``ByteBudget``, ``enforce_budget``) are in server/cache/budget.py: they use
the tree, which uses these policies.
"""

from __future__ import annotations

from collections.abc import Hashable
from enum import IntEnum
from typing import TYPE_CHECKING, Protocol

if TYPE_CHECKING:
    from server.cache.lifecycle import SessionRegistry
    from server.cache.radix_node import RadixNode


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
