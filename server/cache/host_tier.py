"""Tier H: KV segments in host RAM, one radix tree within a byte budget.

Only increments are stored: inserting a token path asks the extractor for the ranges the
tree does not hold yet, and a segment is kept as views over the one buffer llama.cpp wrote
(no further copy; a split keeps both halves on that buffer). A match may end inside an
edge; the usable part of that edge is sliced from its segment without changing the tree.
The byte budget is a hard limit: when locked or pinned nodes cannot be evicted to make
room, the store is declined (nothing is extracted, or what was inserted is taken out).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from server.cache.eviction import ByteBudget, EvictionPolicy, enforce_budget
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
        self.declined = 0
        self.bytes_per_token = 0  # learnt from the first stored segment (KV layout)

    def match(self, tokens: list[int]) -> TierMatch:
        m = self.tree.match_prefix(tokens, require_payload=True, touch=True)
        segments = [n.payload for n in m.path]
        length = m.length
        if m.partial_node is not None and m.partial_node.payload is not None and m.partial_tokens > 0:
            segments.append(m.partial_node.payload.slice(0, m.partial_tokens))
            length += m.partial_tokens
        return TierMatch(length, segments, m.last_node if m.path else None)

    def store(self, tokens: list[int], extract: Callable[[int, int], KVSegment]) -> InsertResult | None:
        """Add the path; extract(start, end) is called only for ranges not held yet.
        Returns None when the budget cannot make room (the store is declined)."""
        have = self.tree.match_prefix(tokens, require_payload=True, touch=False).longest
        incoming = (len(tokens) - have) * self.bytes_per_token
        if incoming and not self._make_room(incoming):
            self.declined += 1
            return None
        result = self.tree.insert(tokens, self._remember_layout(extract))
        if self.tree.total_bytes > self.budget_bytes and not self._make_room(0):
            for node in result.new_nodes + result.filled_nodes:
                if node.attached and node.payload is not None and node.lock_ref == 0:
                    self.tree.remove_payload(node)
            self.declined += 1
            return None
        return result

    def _remember_layout(self, extract: Callable[[int, int], KVSegment]) -> Callable[[int, int], KVSegment]:
        def wrapped(s: int, e: int) -> KVSegment:
            seg = extract(s, e)
            self.bytes_per_token = seg.nbytes // seg.n_tokens
            return seg
        return wrapped

    def _make_room(self, incoming: int) -> bool:
        res = enforce_budget(self.tree, ByteBudget(self.budget_bytes), self.policy, incoming)
        self.evictions += len(res.freed_nodes)
        self.evicted_bytes += res.freed_bytes
        return res.satisfied

    def flush(self) -> int:
        res = self.tree.flush(self.policy)
        self.evictions += len(res.freed_nodes)
        return res.freed_bytes

    def stats(self) -> dict:
        s = self.tree.stats()
        return {"entries": s.n_payloads, "tokens": s.payload_tokens, "bytes": s.total_bytes,
                "budget_bytes": self.budget_bytes, "hits": self.hits, "evictions": self.evictions,
                "evicted_bytes": self.evicted_bytes, "declined": self.declined}
