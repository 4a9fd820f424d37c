"""One token radix tree for every KV source but the slots' own (S, H, D).

Each node owns one compressed edge of tokens (``key``) and, per stored tier,
an optional *value*: a payload holding that edge's KV in the tier's form
(host views, a disk file range).  A node also records its device *holders*:
the llama.cpp sequences (resident owners) whose cells cover its range.  As in
SGLang's HiCache, one node records every place its KV lives, so one walk
tells how far a prompt is available in each (``MatchResult.span``,
``MatchResult.held_span``), shared prefixes are indexed once for all, and
lifecycle tags and lock references mean the same thing everywhere.

Contracts the rest of the cache relies on:

* A value's KV is valid only on its own radix path (the KV of a token
  depends on every token before it).  The tree never moves a value to
  another path; splitting an edge splits every value with it.
* ``value.n_tokens == len(node.key)`` for every value of a node.
* A node's key is never empty (except the root's); no two siblings share a
  first token.
* A tier's prefix is usable only up to the first node on the path without a
  value in that tier (``span``); eviction in a tier takes values from the
  bottom of that tier's paths (a node none of whose children holds a value in
  it), so eviction itself never opens a hole.
* A holder covers a whole path from the root: every ancestor of a node it
  holds lists it too.  Holders are added and removed by their owner (the
  device cells live as long as it says), never by eviction or locks.
* Evicting a tier's value leaves the node's other tiers' values and its
  holders alone.  A node with no value, no holder and no children is pruned
  (it indexes nothing).
* Nodes with ``lock_ref > 0`` lose no value in any tier and are never pruned;
  locking a node locks its whole path to the root.
* Per-tier byte counters (``tier(t)``), ``n_nodes``, ``n_tokens`` and
  ``held_tokens`` (positions some holder covers: the cells the holders use
  together) are kept incrementally; ``check_invariants()`` recomputes them.

The tree is pure bookkeeping: it never touches llama.cpp or files.  The tiers
turn values into KV (restore), create them (extract, write) and release what
eviction returns; the resident owners attach and free the device cells.  It
is not thread-safe: every user holds ``tree.mutex``
(the engine thread for H, the disk writer thread for D) around each use.
"""

from __future__ import annotations

import itertools
import threading
from collections.abc import Callable, Hashable, Iterator, Sequence
from typing import TYPE_CHECKING

from server.cache.eviction_queue import EvictionQueue
from server.cache.radix_invariants import check_invariants
from server.cache.radix_node import RadixNode, SegmentPayload, Tokens
from server.cache.radix_results import (  # noqa: F401 - the tree's answers are its API: importable from here too
    DetachedNodeError,
    EvictResult,
    InsertResult,
    MatchResult,
    MemoryUse,
    NodeLockedError,
    PayloadSizeError,
    RadixTreeError,
    TierCounters,
    TierSpan,
    TreeInvariantError,
)

if TYPE_CHECKING:
    from server.cache.eviction import EvictionPolicy

PayloadFactory = Callable[[int, int], "SegmentPayload | None"]
"""``payload_for_range(start, end)``: the payload for tokens ``[start, end)`` of
the sequence being inserted, or None when the caller has none for that range."""


def _bare(node: RadixNode) -> bool:
    """Indexes no KV of its own (it may still be the path to children)."""
    return not node.values and not node.holders


def _rank(policy: EvictionPolicy | None, node: RadixNode) -> Hashable | None:
    """``node``'s eviction key under ``policy`` (None: LRU); None when the policy refuses to evict it now."""
    return (node.last_access,) if policy is None else policy.priority(node)


def _full_match(key: Tokens, tokens: Tokens, pos: int) -> int:
    """Length of the common prefix of ``key`` and ``tokens[pos:]``."""
    end = pos + len(key)
    if tokens[pos:end] == key:
        return len(key)
    n = 0
    for a, b in zip(key, tokens[pos:end]):
        if a != b:
            break
        n += 1
    return n


class RadixTree:
    """Radix tree of per-tier token-range values; see the module docstring for contracts.

    ``clock`` returns the access stamp stored in ``last_access`` (default: a
    per-tree counter, which is strictly increasing and so deterministic).
    ``mutex`` is the lock every user of a shared tree holds around each use.
    """

    def __init__(self, *, clock: Callable[[], float] | None = None) -> None:
        self._ids = itertools.count()
        self._clock: Callable[[], float] = clock if clock is not None else itertools.count(1).__next__
        self.mutex = threading.RLock()
        self.root = RadixNode(next(self._ids), (), None, self._clock())
        self.n_nodes = 0
        self.n_tokens = 0
        self.held_tokens = 0
        self._tiers: dict[str, TierCounters] = {}
        # Per tier, the nodes eviction may take a value from: those holding one that no child
        # holds one under (the bottom of the tier's paths). Kept as values come and go, so
        # eviction never walks the whole tree (as SGLang's radix cache keeps evictable leaves).
        self._bottoms: dict[str, set[RadixNode]] = {}
        # Leaves that may index nothing (inserted as structure only, or left bare under a
        # lock): pruned at the next eviction if nothing came to hang on them.
        self._maybe_bare: set[RadixNode] = set()
        self._queues: dict[str, EvictionQueue] = {}  # per tier: its bottoms in eviction order

    def tier(self, name: str) -> TierCounters:
        """The counters of tier ``name`` (all zero for a tier that never held a value)."""
        counters = self._tiers.get(name)
        if counters is None:
            counters = self._tiers[name] = TierCounters()
        return counters

    def counters(self, name: str) -> TierCounters:
        """Tier ``name``'s counters for reading without ``mutex`` (metrics, stats): the live
        object, whose integers may be one update apart, or zeros; never creates an entry."""
        return self._tiers.get(name) or TierCounters()

    # ------------------------------------------------------------------ match

    def match_prefix(self, tokens: Sequence[int], *, touch: bool = True) -> MatchResult:
        """Find the longest prefix of ``tokens`` held by the tree as structure;
        ``span(tier)`` of the result says what each tier holds of it.

        With ``touch`` the matched whole nodes get a fresh ``last_access`` stamp
        (the partial node does not: it may not be used).
        """
        tokens = tuple(tokens)
        node = self.root
        path: list[RadixNode] = []
        pos = 0
        partial_node: RadixNode | None = None
        partial = 0
        while pos < len(tokens):
            child = node.children.get(tokens[pos])
            if child is None:
                break
            n = _full_match(child.key, tokens, pos)
            if n < len(child.key):
                partial_node, partial = child, n
                break
            path.append(child)
            pos += n
            node = child
        if touch and path:
            stamp = self._clock()
            for visited in path:
                visited.last_access = stamp
        return MatchResult(pos, tuple(path), node, partial_node, partial)

    # ----------------------------------------------------------------- insert

    def insert(
        self,
        tokens: Sequence[int],
        tier: str | None = None,
        payload_for_range: PayloadFactory | None = None,
        *,
        fill_missing: bool = True,
    ) -> InsertResult:
        """Add ``tokens`` as a path, storing in ``tier`` only what it lacks.

        Existing nodes are reused (an edge is split where the sequence leaves
        it or ends inside it); one new node is created for the suffix that is
        not yet present, and ``payload_for_range(start, end)`` is asked for
        that range.  With ``fill_missing`` it is also asked for the range of
        each existing node on the path without a value in ``tier``, so the path
        becomes usable in that tier; returning None leaves such a node as it
        was.  Without ``tier`` (and factory) only structure is added.

        If ``payload_for_range`` raises, the tree stays consistent: splits and
        fills already made remain, the new suffix node is not created.
        """
        if (tier is None) != (payload_for_range is None):
            raise ValueError("insert takes a tier and a payload factory together, or neither")
        tokens = tuple(tokens)
        stamp = self._clock()
        node = self.root
        pos = 0
        path: list[RadixNode] = []
        filled: list[RadixNode] = []
        while pos < len(tokens):
            child = node.children.get(tokens[pos])
            if child is None:
                break
            n = _full_match(child.key, tokens, pos)
            if n < len(child.key):
                child = self._split(child, n)
            end = pos + len(child.key)
            if tier is not None and tier not in child.values and fill_missing and payload_for_range is not None:
                payload = payload_for_range(pos, end)
                if payload is not None:
                    self._attach(child, tier, payload)
                    filled.append(child)
            child.last_access = stamp
            path.append(child)
            pos = end
            node = child
        prefix_len = pos
        new_nodes: tuple[RadixNode, ...] = ()
        if pos < len(tokens):
            payload = payload_for_range(pos, len(tokens)) if payload_for_range is not None else None
            if payload is not None:
                self._check_size(payload, len(tokens) - pos)
            leaf = RadixNode(next(self._ids), tokens[pos:], node, stamp)
            node.children[leaf.key[0]] = leaf
            self.n_nodes += 1
            self.n_tokens += len(leaf.key)
            if payload is not None:
                assert tier is not None  # a payload is stored in a tier
                self._attach(leaf, tier, payload)
            else:
                self._maybe_bare.add(leaf)
            path.append(leaf)
            new_nodes = (leaf,)
            node = leaf
        return InsertResult(prefix_len, new_nodes, tuple(filled), node, tuple(path))

    def _split(self, child: RadixNode, offset: int) -> RadixNode:
        halves: dict[str, tuple[SegmentPayload, SegmentPayload]] = {}
        for tier, value in child.values.items():
            # Split and check every value first so a faulty one leaves the tree untouched.
            left, right = value.split(offset)
            self._check_size(left, offset)
            self._check_size(right, len(child.key) - offset)
            halves[tier] = (left, right)
        for tier in list(child.values):
            self._detach_value(child, tier)
        parent = child.parent
        assert parent is not None
        upper = RadixNode(next(self._ids), child.key[:offset], parent, child.last_access)
        # Every lock, holder and session passing through the child passes through its upper half.
        upper.lock_ref = child.lock_ref
        upper.holders = set(child.holders)
        upper.sessions = set(child.sessions)
        parent.children[upper.key[0]] = upper
        child.key = child.key[offset:]
        child.parent = upper
        upper.children[child.key[0]] = child
        self.n_nodes += 1
        for tier, (left, right) in halves.items():
            self._attach(upper, tier, left)
            self._attach(child, tier, right)
        return upper

    # ----------------------------------------------------------------- values

    def remove_value(self, node: RadixNode, tier: str) -> SegmentPayload | None:
        """Drop ``node``'s value in ``tier`` and return it (the caller releases it).

        Other tiers' values stay.  A node left with no value and no children is
        pruned, and so are bare unlocked ancestors that become leaves.  Raises
        NodeLockedError on a locked node.
        """
        self._require_attached(node)
        if node.is_root:
            raise ValueError("the root holds no value")
        if node.lock_ref > 0:
            raise NodeLockedError(f"cannot remove a value of locked {node!r}")
        old = self._detach_value(node, tier) if tier in node.values else None
        self._prune_up(node)
        return old

    def replace_value(self, node: RadixNode, tier: str, payload: SegmentPayload) -> SegmentPayload:
        """Put ``payload`` (the same KV in another form, e.g. a compacted copy) in place of
        ``node``'s value in ``tier``; returns the old value. Locks do not matter: the KV is
        the same, and a reader keeps the old value it holds."""
        self._require_attached(node)
        self._check_size(payload, len(node.key))
        old = self._detach_value(node, tier)
        self._attach(node, tier, payload)
        return old

    @staticmethod
    def _require_attached(node: RadixNode) -> None:
        if not node.attached:
            raise DetachedNodeError(f"{node!r} is no longer in the tree")

    def _attach(self, node: RadixNode, tier: str, payload: SegmentPayload) -> None:
        self._check_size(payload, len(node.key))
        node.values[tier] = payload
        self._account(node, tier, payload, +1)
        self._count_child(node.parent, tier, +1)
        self._place_bottom(node, tier)

    def _detach_value(self, node: RadixNode, tier: str) -> SegmentPayload:
        payload = node.values.pop(tier)
        self._account(node, tier, payload, -1)
        self._count_child(node.parent, tier, -1)
        self._place_bottom(node, tier)
        return payload

    def _count_child(self, parent: RadixNode | None, tier: str, sign: int) -> None:
        if parent is None:
            return
        parent.tier_children[tier] = parent.tier_children.get(tier, 0) + sign
        self._place_bottom(parent, tier)

    def _place_bottom(self, node: RadixNode, tier: str) -> None:
        """Keep ``node`` in tier's bottoms exactly while it holds a value no child holds under
        (and in the tier's eviction queue from the moment it becomes one)."""
        bottoms = self._bottoms.setdefault(tier, set())
        if node.attached and not node.is_root and tier in node.values and not node.tier_children.get(tier):
            if node not in bottoms:
                bottoms.add(node)
                queue = self._queues.get(tier)
                if queue is not None:
                    queue.push(node)
        else:
            bottoms.discard(node)

    @staticmethod
    def _check_size(payload: SegmentPayload, n_tokens: int) -> None:
        if payload.n_tokens != n_tokens:
            raise PayloadSizeError(f"payload covers {payload.n_tokens} tokens, its range has {n_tokens}")
        if payload.nbytes < 0:
            raise PayloadSizeError(f"payload reports negative size {payload.nbytes}")

    def _account(self, node: RadixNode, tier: str, payload: SegmentPayload, sign: int) -> None:
        c = self.tier(tier)
        if node.lock_ref > 0:
            c.protected_bytes += sign * payload.nbytes
        else:
            c.evictable_bytes += sign * payload.nbytes
        c.n_payloads += sign
        c.payload_tokens += sign * payload.n_tokens
        c.use(node, payload, sign)

    def _prune_up(self, node: RadixNode) -> None:
        """Detach ``node`` and its ancestors while each is a bare, unlocked leaf. A bare leaf
        kept only by a lock is pruned at an eviction once unlocked (``_maybe_bare``)."""
        cur: RadixNode | None = node
        while cur is not None and not cur.is_root and cur.is_leaf and _bare(cur) and cur.lock_ref == 0:
            parent = cur.parent
            self._detach_leaf(cur)
            cur = parent
        if cur is not None and not cur.is_root and cur.is_leaf and _bare(cur):
            self._maybe_bare.add(cur)

    # ---------------------------------------------------------------- holders

    def add_holder(self, node: RadixNode, holder: int) -> None:
        """Record that sequence ``holder``'s device cells cover the path to ``node``."""
        self._require_attached(node)
        for n in node.iter_up():
            if not n.holders:
                self.held_tokens += len(n.key)
            n.holders.add(holder)

    def remove_holder(self, node: RadixNode, holder: int) -> None:
        """Undo ``add_holder(node, holder)`` (its cells are gone); bare nodes are pruned.
        Locks do not keep a holder: the cells are freed whatever the tree says."""
        self._require_attached(node)
        for n in node.iter_up():
            if holder in n.holders:
                n.holders.remove(holder)
                if not n.holders:
                    self.held_tokens -= len(n.key)
        self._prune_up(node)
        if node.attached and _bare(node):
            self._maybe_bare.add(node)  # kept by a lock: pruned at an eviction once unlocked

    # ------------------------------------------------------------------ locks

    def lock(self, node: RadixNode) -> None:
        """Protect ``node`` and its path to the root from eviction in every tier
        (reentrant).  Locking the root is a no-op (an empty match locks nothing)."""
        self._require_attached(node)
        for n in node.iter_up():
            if n.lock_ref == 0:
                for tier, value in n.values.items():
                    c = self.tier(tier)
                    c.evictable_bytes -= value.nbytes
                    c.protected_bytes += value.nbytes
            n.lock_ref += 1

    def unlock(self, node: RadixNode) -> None:
        """Undo one ``lock(node)``."""
        self._require_attached(node)
        path = list(node.iter_up())
        if any(n.lock_ref <= 0 for n in path):
            raise RadixTreeError(f"unlock without a matching lock on {node!r}")
        for n in path:
            n.lock_ref -= 1
            if n.lock_ref == 0:
                for tier, value in n.values.items():
                    c = self.tier(tier)
                    c.protected_bytes -= value.nbytes
                    c.evictable_bytes += value.nbytes

    # --------------------------------------------------------------- eviction

    def evict(self, bytes_needed: int, tier: str, policy: EvictionPolicy | None = None,
              floor: Hashable | None = None) -> EvictResult:
        """Take ``tier``'s values off unlocked nodes in policy order until
        ``bytes_needed`` are freed; with ``floor`` (a policy key), only nodes ranked below it.

        A candidate holds a value in ``tier`` and none of its children does (the
        bottom of the tier's paths); once its value goes, its parent may become
        one.  Bare unlocked leaves met on the way are pruned.  Stops early when
        nothing evictable remains: check ``EvictResult.satisfied``.
        ``policy=None`` means LRU; a policy may return None for a node it
        refuses to evict now (e.g. pinned).
        """
        if bytes_needed < 0:
            raise ValueError(f"bytes_needed must be >= 0, got {bytes_needed}")
        return self._evict(tier, bytes_needed, policy, floor)

    def evictable_below(self, tier: str, policy: EvictionPolicy | None, floor: Hashable) -> int:
        """The bytes of ``tier``'s values that ``evict(..., floor=floor)`` could take at most, taking
        nothing: a value goes only once every value under it has gone, so one ranked at or above the
        floor (or locked, or refused by the policy) keeps its whole path's values. Counts values' own
        bytes (a buffer shared with a survivor frees later, in rounds): an estimate, to decline a store
        that cannot fit before evicting anything for it. Walks every node."""
        removable: dict[RadixNode, bool] = {}
        total = 0
        for node in reversed(list(self.nodes())):  # children before their parents
            if tier not in node.values:
                continue
            ok = node.lock_ref == 0 and all(removable.get(c, True) for c in node.children.values())
            if ok:
                key = _rank(policy, node)
                ok = key is not None and key < floor  # type: ignore[operator]  # (one policy's keys compare)
            removable[node] = ok
            total += node.values[tier].nbytes if ok else 0
        return total

    def flush(self, tier: str, policy: EvictionPolicy | None = None) -> EvictResult:
        """Evict every value of ``tier`` that the locks and the policy allow (POST /cache/flush)."""
        return self._evict(tier, None, policy)

    def _evict(self, tier: str, limit: int | None, policy: EvictionPolicy | None,
               floor: Hashable | None = None) -> EvictResult:
        freed: list[tuple[RadixNode, SegmentPayload]] = []
        freed_bytes = 0
        freed_tokens = 0
        if limit == 0:
            return EvictResult(tier, limit, (), 0, 0)

        def priority(node: RadixNode) -> Hashable | None:
            return _rank(policy, node)

        bare, self._maybe_bare = self._maybe_bare, set()
        for node in bare:
            if node.attached and node.lock_ref > 0:
                self._maybe_bare.add(node)  # pruned at an eviction after its unlock, or it gets a value
            elif node.attached:
                self._prune_up(node)
        bottoms = self._bottoms.setdefault(tier, set())
        queue = self._queues.get(tier)
        if queue is None or queue.policy is not policy:
            queue = self._queues[tier] = EvictionQueue(policy, priority, bottoms)
        else:
            queue.compact(bottoms)
        candidates = queue.pop_candidates(lambda n: n in bottoms)
        try:
            for node in candidates:  # each one is evicted: a parent becoming a bottom joins the queue
                if floor is not None:
                    key = priority(node)
                    if key is not None and not key < floor:  # type: ignore[operator]  # (one policy's keys compare)
                        queue.push(node)  # ranked at or above the floor: it stays, and so do all after it
                        break
                value = self._detach_value(node, tier)
                freed.append((node, value))
                freed_bytes += value.nbytes
                freed_tokens += len(node.key)
                self._prune_up(node)
                if limit is not None and freed_bytes >= limit:
                    break
        finally:
            candidates.close()
        return EvictResult(tier, limit, tuple(freed), freed_bytes, freed_tokens)

    def _detach_leaf(self, node: RadixNode) -> None:
        parent = node.parent
        assert parent is not None and node.is_leaf and node.lock_ref == 0 and _bare(node)
        del parent.children[node.key[0]]
        node.attached = False
        self._maybe_bare.discard(node)
        for bottoms in self._bottoms.values():
            bottoms.discard(node)
        self.n_nodes -= 1
        self.n_tokens -= len(node.key)

    # ------------------------------------------------------------- inspection

    def nodes(self) -> Iterator[RadixNode]:
        """All nodes, root excluded, parents before children."""
        stack = list(self.root.children.values())
        while stack:
            node = stack.pop()
            yield node
            stack.extend(node.children.values())

    def check_invariants(self) -> None:
        """Recompute structure and counters from scratch; raise TreeInvariantError on mismatch (radix_invariants.py)."""
        check_invariants(self)
