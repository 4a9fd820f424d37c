"""Bélády's rule on the radix tree: evict what is reused furthest in the future (never first).

`NextUse` knows the whole arrival order in advance. A node is used by a later request when that
request's prompt follows the node's path into its own key (at least its first token: the tree
files children by their first token, so such a prompt walks through the node and reuses some of
its value). A rolling hash of every prompt prefix, indexed by length, answers "the first arrival
after position q whose prompt starts with this path" with one dictionary look-up and a bisection.

For pages of one size and one cache level, evicting the page used furthest in the future is
optimal (Bélády, 1966). Here values differ in size and there are tiers, so the rule is the
classical reference rather than a proven lower bound: a policy may, rarely, compute a little
less. It is what the issue calls the bound, and what each policy is judged against.
"""

from __future__ import annotations

import bisect
from collections import defaultdict
from collections.abc import Sequence
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from server.cache.radix_node import RadixNode

_MOD = (1 << 61) - 1
_BASE = 1_000_003


def _step(h: int, token: int) -> int:
    return (h * _BASE + token + 1) % _MOD


class NextUse:
    """For each prefix (length, hash) of any prompt: the arrival positions of the prompts that start
    with it, in order."""

    def __init__(self, prompts: Sequence[Sequence[int]], arrival: Sequence[int]) -> None:
        self._uses: dict[tuple[int, int], list[int]] = defaultdict(list)
        for position, index in enumerate(arrival):
            h = 0
            for length, token in enumerate(prompts[index], start=1):
                h = _step(h, token)
                uses = self._uses[(length, h)]
                if not uses or uses[-1] != position:
                    uses.append(position)
        self._full: dict[int, tuple[int, int, int]] = {}  # node id -> (start, key length, hash of its path)

    def _path_hash(self, node: RadixNode) -> int:
        """Hash of every token from the root through the end of `node`'s key."""
        if node.parent is None:
            return 0
        start = node.start()
        cached = self._full.get(node.id)
        if cached is not None and cached[0] == start and cached[1] == len(node.key):
            return cached[2]
        h = self._path_hash(node.parent)
        for token in node.key:
            h = _step(h, token)
        self._full[node.id] = (start, len(node.key), h)
        return h

    def next_use(self, node: RadixNode, after: int) -> int | None:
        """The first arrival position after `after` whose prompt enters `node`, or None."""
        if node.parent is None:
            return None
        first = _step(self._path_hash(node.parent), node.key[0])
        uses = self._uses.get((node.start() + 1, first))
        if not uses:
            return None
        k = bisect.bisect_right(uses, after)
        return uses[k] if k < len(uses) else None


class BeladyPolicy:
    """An eviction policy (server/cache/eviction.py) for one moment: arrivals up to `position`
    have been seen. Never used again first, then the furthest next use, LRU among equals."""

    name = "belady"

    def __init__(self, oracle: NextUse, position: int) -> None:
        self.oracle = oracle
        self.position = position

    def priority(self, node: RadixNode) -> tuple[int, int, float]:
        nxt = self.oracle.next_use(node, self.position)
        return (0, 0, node.last_access) if nxt is None else (1, -nxt, node.last_access)

    def worth_storing(self, node: RadixNode) -> bool:
        return self.oracle.next_use(node, self.position) is not None
