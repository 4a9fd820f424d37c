"""The order in which one tier's values may be evicted, kept between evictions.

The radix tree tells the queue when a node becomes, or stops being, a *bottom* of a tier (it
holds a value there that no child holds under: the only place eviction may take from). The
queue keeps those nodes in a heap keyed by the eviction policy, so an eviction pops the few
entries it needs instead of ranking every node of the tree again (SGLang's radix cache keeps
its evictable leaves the same way).

Keys are checked lazily: an entry's key was the policy's at push time; when popped it is
computed again, and an entry whose key grew (an LRU node touched since) goes back in with
the new key. For LRU, whose keys only grow, the order is exact. A policy whose keys can
shrink (a lifecycle class that drops) may take such a node a little later than a full
re-ranking would. Nodes the policy refuses now (None) and locked nodes are set aside and
looked at again at the next eviction. Stale entries (a node no longer a bottom) are skipped,
and the heap is rebuilt when they outnumber the live ones. A policy whose keys move with time
both ways (server/cache/predictive_policy.py) names its current `epoch`: when it changed since
the last eviction, every node is ranked again first.
"""

from __future__ import annotations

import heapq
from collections.abc import Callable, Generator, Hashable, Iterable
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from server.cache.radix_node import RadixNode

Priority = Callable[["RadixNode"], "Hashable | None"]


class EvictionQueue:
    def __init__(self, policy: object | None, priority: Priority, bottoms: Iterable[RadixNode]):
        """`policy` identifies the ranking (the tree rebuilds the queue for another one);
        `priority` ranks a node (smaller first, None: not now)."""
        self.policy = policy
        self._priority = priority
        self._heap: list[tuple[Hashable, int, RadixNode]] = []
        self._aside: set[RadixNode] = set()  # refused by the policy or locked: looked at again next time
        self._epoch = getattr(policy, "epoch", None)
        for node in bottoms:
            self.push(node)

    def push(self, node: RadixNode) -> None:
        """`node` became a bottom of the tier (or may rank differently now)."""
        key = self._priority(node) if node.lock_ref == 0 else None
        if key is None:
            self._aside.add(node)
        else:
            heapq.heappush(self._heap, (key, node.id, node))

    def pop_candidates(self, is_bottom: Callable[[RadixNode], bool]) -> Generator[RadixNode, None, None]:
        """Nodes to evict, best first, while the caller keeps asking; `is_bottom` says whether
        a node is still one. A node yielded and not evicted must be pushed back by the caller."""
        aside, self._aside = self._aside, set()
        epoch = getattr(self.policy, "epoch", None)
        if epoch != self._epoch:  # the policy's keys moved: rank every node again
            self._epoch = epoch
            aside |= {node for _, _, node in self._heap}
            self._heap = []
        for node in aside:
            if is_bottom(node):
                self.push(node)
        held_back: list[RadixNode] = []
        try:
            while self._heap:
                key, _, node = heapq.heappop(self._heap)
                if not is_bottom(node):
                    continue  # stale: it lost its value, got a child's, or left the tree
                if node.lock_ref > 0:
                    held_back.append(node)
                    continue
                now = self._priority(node)
                if now is None:
                    held_back.append(node)
                    continue
                if now != key:
                    heapq.heappush(self._heap, (now, node.id, node))
                    continue
                yield node
        finally:
            self._aside.update(held_back)

    def compact(self, bottoms: set[RadixNode]) -> None:
        """Rebuild from the tier's bottoms once stale entries outnumber them."""
        if len(self._heap) + len(self._aside) > 2 * len(bottoms) + 64:
            self._heap, self._aside = [], set()
            for node in bottoms:
                self.push(node)
