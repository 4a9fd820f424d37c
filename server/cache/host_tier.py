"""Tier H: KV segments in host RAM, as the H values of the shared radix tree, within a
byte budget.

Only increments are stored: inserting a token path reads from the offered KV (a `PathKV`,
server/cache/path_kv.py: the device's cells) only the ranges whose nodes hold no H value yet,
and a segment is kept as views over the one buffer llama.cpp wrote (no further copy; a split
keeps both halves on that buffer). A match may end inside an edge; the usable part of that
edge is sliced from its segment without changing the tree.
The byte budget is a hard limit on the buffers H values keep alive, each charged whole
(`TierCounters.held_bytes`): a slice that outlives the rest of its buffer is copied out
into a buffer of its own once less than half of the buffer is in use, so evicting part of
a buffer frees memory. Evicting H values keeps the nodes' D values; when locked or pinned
nodes cannot be evicted to make room, the store is declined (nothing is extracted, or what
was inserted is taken out); under a policy that ranks a path by its sessions, a store that what
ranks below it could not make room for evicts nothing (`admits` asks the same before a read).
A store hands the tiers below (D, R) H's values on the path (views, read under the lock when
one of them asks). The disk writer thread shares the tree, so every use holds `tree.mutex`.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Hashable
from dataclasses import dataclass
from typing import cast

from server.cache.budget import ByteBudget, enforce_budget
from server.cache.eviction import EvictionPolicy
from server.cache.kv_format import KVSegment, cut, positioned
from server.cache.kv_ops import RestoreError
from server.cache.path_kv import HeldKV, Ranges, one_segment
from server.cache.radix_tree import MatchResult, RadixNode, RadixTree
from server.cache.tiers import PathKV, Source

TIER = Source.H


@dataclass(frozen=True)
class TierMatch:
    """A reusable prefix in a tier: `length` tokens, as segments in path order."""

    length: int
    segments: list[KVSegment]
    tip: RadixNode | None  # deepest whole node used: lock it while the segments are restored


class HostTier:
    """A `KVTier` (server/cache/tiers.py)."""

    source = TIER

    def __init__(self, tree: RadixTree, budget_bytes: int, policy: EvictionPolicy):
        self.tree = tree
        self.budget_bytes = budget_bytes
        self.policy = policy
        self.hits = 0
        self.evictions = 0
        self.evicted_bytes = 0
        self.declined = 0
        self.copied_out = 0  # slices copied out of a mostly evicted buffer
        self.bytes_per_token = 0  # KV bytes per token, learnt from the last segment read for a store

    def take(self, m: MatchResult) -> TierMatch:
        """What H holds of a match of the shared tree (caller holds `tree.mutex`)."""
        span = m.span(TIER)
        segments = [cast(KVSegment, n.values[TIER]) for n in span.nodes]
        if span.partial_node is not None:
            segments.append(cast(KVSegment, span.partial_node.values[TIER]).slice(0, span.partial_tokens))
        return TierMatch(span.longest, segments, span.tip)

    def lookup(self, tokens: list[int], walk: MatchResult | None = None) -> TierMatch:
        """What H holds of `tokens`, from `walk` (the shared tree's match of them, under
        `tree.mutex`) when given."""
        if walk is not None:
            return self.take(walk)
        with self.tree.mutex:
            return self.take(self.tree.match_prefix(tokens))

    def load(self, match: TierMatch, start: int = 0) -> list[KVSegment]:
        """The segments of positions [start, match.length) (views, no copy); a hit."""
        parts = cut(positioned(match.segments), start, match.length)
        if parts is None:
            raise RestoreError(f"the host segments do not cover positions [{start}, {match.length})")
        self.hits += 1
        return parts

    def held_depth(self, tokens: list[int]) -> int:
        """The leading tokens of `tokens` H holds (what a store of them would not read)."""
        with self.tree.mutex:
            return self.tree.match_prefix(tokens, touch=False).span(TIER).longest

    def store(self, tokens: list[int], kv: PathKV) -> HeldKV | None:
        """Add the path; `kv` is read only for ranges H does not hold yet. Returns H's values
        on the path (for the tiers below), or None when the budget cannot make room (the
        store is declined) or the path's end is no longer on the tree."""
        with self.tree.mutex:
            have = self.held_depth(tokens)
            estimate = (len(tokens) - have) * self.bytes_per_token
            floor = self._floor(kv.sessions)
            if estimate and not self._make_room(estimate, floor):  # nothing is read for a store that cannot fit
                self.declined += 1
                return None
            # Then read what H lacks and make room for the bytes it really keeps alive (a
            # whole buffer, headers included) before inserting: inserting first and evicting
            # after would hold more than the budget in between, which a scrape can see.
            fresh = one_segment(kv, have, len(tokens)) if have < len(tokens) else None
            incoming = getattr(fresh, "memory", fresh).nbytes if fresh is not None else 0
            if fresh is not None:  # the next store's estimate: this segment's own rows (not a larger buffer
                self.bytes_per_token = -(-fresh.nbytes // fresh.n_tokens)  # it may be a view of) per token
            if incoming > estimate and not self._make_room(incoming, floor):
                self.declined += 1
                return None
            extract = self._from(fresh, have, lambda s, e: one_segment(kv, s, e))
            result = self.tree.insert(tokens, TIER, extract)
            if kv.tag is not None and result.last_node.attached:
                kv.tag(result.last_node)  # valued by its sessions before any room is made
            if self.tree.tier(TIER).held_bytes > self.budget_bytes and not self._make_room(0):
                for node in result.new_nodes + result.filled_nodes:
                    if node.attached and TIER in node.values and node.lock_ref == 0:
                        self.tree.remove_value(node, TIER)
                self.declined += 1
                return None
            tip = result.last_node
            if not tip.attached:
                return None
            return HeldKV(lambda: self._values_on_path(tip), tip, kv.checkpoints, kv.tag, kv.sessions)

    def _values_on_path(self, tip: RadixNode) -> Ranges:
        """H's values on the path to `tip`, as (position, segment) ranges (views)."""
        with self.tree.mutex:
            path = [n for n in tip.iter_up()][::-1]
            return [(n.start(), cast(KVSegment, n.values[TIER])) for n in path if TIER in n.values]

    @staticmethod
    def _from(fresh: KVSegment | None, have: int,
              extract: Callable[[int, int], KVSegment]) -> Callable[[int, int], KVSegment]:
        """Ranges at or past `have` as views of `fresh` (the KV of [have, len)); any other
        range from `extract`."""
        def view(s: int, e: int) -> KVSegment:
            return fresh.slice(s - have, e - have) if fresh is not None and s >= have else extract(s, e)
        return view

    def admits(self, tokens: list[int], sessions: tuple[str, ...]) -> bool:
        """Whether a store of `tokens` for `sessions` could make its room now (what H lacks of them, at the last
        store's bytes per token), evicting nothing: False when the policy ranks too little of what H holds below
        the path (`_floor`). A write-back asks before it reads a copy out (server/cache/write_back.py)."""
        floor = self._floor(sessions)
        with self.tree.mutex:
            estimate = (len(tokens) - self.held_depth(tokens)) * self.bytes_per_token
            return floor is None or self._fits(estimate, floor)

    def _fits(self, incoming: int, floor: Hashable) -> bool:
        """Whether evicting what ranks below `floor` could make room for `incoming` bytes (an estimate: values'
        own bytes), taking nothing (caller holds `tree.mutex`)."""
        over = ByteBudget(self.budget_bytes).over_by(self.tree.tier(TIER).held_bytes, incoming)
        return over == 0 or self.tree.evictable_below(TIER, self.policy, floor) >= over

    def _floor(self, sessions: tuple[str, ...]) -> Hashable | None:
        """The key the incoming path ranks at: making room for it, H evicts only what ranks below (else the store is
        declined, and the path is lost rather than something worth more). Only under a policy that values sessions
        (predictive: its sessions' value, any access time); under LRU and the lifecycle classes a new path outranks
        every older one, as before."""
        rank = getattr(self.policy, "sessions_priority", None)
        return None if rank is None else rank(sessions, math.inf)

    def _make_room(self, incoming: int, floor: Hashable | None = None) -> bool:
        """Evict by the policy until `incoming` more bytes fit; with `floor`, only what ranks below it, and nothing
        at all when that could not be enough (a declined store leaves what H holds as it was)."""
        if floor is not None and not self._fits(incoming, floor):
            return False
        res = enforce_budget(self.tree, TIER, ByteBudget(self.budget_bytes), self.policy, incoming,
                             settle=self._copy_out_survivors, floor=floor)
        self.evictions += len(res.freed)
        self.evicted_bytes += res.freed_bytes
        return res.satisfied

    def _copy_out_survivors(self, freed) -> None:
        """After an eviction round: a buffer now less than half used keeps its surviving
        slices alive at its full size, so they move to buffers of their own (a copy of at
        most half the buffer), and the buffer is freed."""
        uses = self.tree.tier(TIER).memory
        shared = (getattr(value, "memory", None) for _, value in freed)
        for memory in {id(m): m for m in shared if m is not None}.values():
            use = uses.get(id(memory))
            if use is None or use.live_bytes * 2 >= memory.nbytes:
                continue
            for node in list(use.nodes):
                self.tree.replace_value(node, TIER, node.values[TIER].compact())
                self.copied_out += 1

    def evict(self, nbytes: int) -> int:
        """Drop at least `nbytes` of H's buffers by the policy (locked and pinned nodes stay,
        so it may free less); the bytes of the values freed."""
        with self.tree.mutex:
            held = self.tree.tier(TIER).held_bytes
            res = enforce_budget(self.tree, TIER, ByteBudget(max(0, held - nbytes)), self.policy,
                                 settle=self._copy_out_survivors)
            self.evictions += len(res.freed)
            self.evicted_bytes += res.freed_bytes
        return res.freed_bytes

    def flush(self) -> int:
        with self.tree.mutex:
            res = self.tree.flush(TIER, self.policy)
        self.evictions += len(res.freed)
        return res.freed_bytes

    def close(self) -> None:
        """Nothing to finish: H writes nothing in the background."""

    def stats(self) -> dict:
        """Counters, read without `tree.mutex` (which the engine holds while it extracts KV):
        a scrape never waits for the cache."""
        c = self.tree.counters(TIER)
        return {"entries": c.n_payloads, "tokens": c.payload_tokens, "bytes": c.total_bytes,
                "held_bytes": c.held_bytes, "budget_bytes": self.budget_bytes, "copied_out": self.copied_out,
                "hits": self.hits, "evictions": self.evictions, "evicted_bytes": self.evicted_bytes,
                "declined": self.declined}
