"""Tier H: KV segments in host RAM, one radix tree within a byte budget.

Only increments are stored: inserting a token path asks the extractor for the ranges the
tree does not hold yet. A match may end inside an edge; the usable part of that edge is
sliced from its segment without changing the tree.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from server.cache.eviction import EvictionPolicy
from server.cache.kv_format import KVSegment
from server.cache.radix_tree import InsertResult, RadixNode, RadixTree


@dataclass(frozen=True)
class TierMatch:
    """A reusable prefix in a tier: `length` tokens, as segments in path order."""

    length: int
    segments: list[KVSegment]
    tip: RadixNode | None  # deepest whole node used


class HostTier:
    name = "H"

    def __init__(self, budget_bytes: int, policy: EvictionPolicy):
        self.tree = RadixTree()
        self.budget_bytes = budget_bytes
        self.policy = policy
        self.hits = 0
        self.evictions = 0
        self.evicted_bytes = 0

    def match(self, tokens: list[int]) -> TierMatch:
        m = self.tree.match_prefix(tokens, require_payload=True, touch=True)
        segments = [n.payload for n in m.path]
        length = m.length
        if m.partial_node is not None and m.partial_node.payload is not None and m.partial_tokens > 0:
            segments.append(m.partial_node.payload.slice(0, m.partial_tokens))
            length += m.partial_tokens
        return TierMatch(length, segments, m.last_node if m.path else None)

    def store(self, tokens: list[int], extract: Callable[[int, int], KVSegment]) -> InsertResult:
        """Add the path; extract(start, end) is called only for ranges not held yet."""
        result = self.tree.insert(tokens, lambda s, e: extract(s, e).compact())
        self.enforce_budget()
        return result

    def enforce_budget(self) -> None:
        over = self.tree.total_bytes - self.budget_bytes
        if over > 0:
            res = self.tree.evict(over, self.policy)
            self.evictions += len(res.freed_nodes)
            self.evicted_bytes += res.freed_bytes

    def flush(self) -> int:
        res = self.tree.flush(self.policy)
        self.evictions += len(res.freed_nodes)
        return res.freed_bytes

    def stats(self) -> dict:
        s = self.tree.stats()
        return {"entries": s.n_payloads, "tokens": s.payload_tokens, "bytes": s.total_bytes,
                "budget_bytes": self.budget_bytes, "hits": self.hits, "evictions": self.evictions,
                "evicted_bytes": self.evicted_bytes}
