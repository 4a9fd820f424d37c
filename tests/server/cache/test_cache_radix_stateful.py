"""Randomized operation sequences on the multi-tier radix tree against a brute-force model.

The reference model is a set of token-sequence prefixes per concern: ``present`` holds
every prefix the tree keeps as structure, ``held[tier]`` the ones covered by a value in
that tier (two tiers, H and D, as the server uses), and each device holder (a resident
owner) the path it was attached to.  They are derived from the
operations alone (insert adds all prefixes; eviction removes the positions of the freed
values; pruning removes what indexes nothing any more), never from a walk of the tree,
and the tree is compared with them after every step.  The rules check the multi-tier
contracts: evicting one tier never loses another tier's values nor any holder, locked
nodes lose no value in any tier, a node with no value or holder left is pruned.
"""

from __future__ import annotations

import hypothesis.strategies as st
from hypothesis import HealthCheck, settings
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

from server.cache.eviction import LifecyclePolicy, LRUPolicy
from server.cache.lifecycle import CACHE_STATES, CacheHint, SessionRegistry
from server.cache.radix_tree import RadixNode, RadixTree
from tests.server.cache.sim_payload import FakePayload
from tests.server.cache.tree_helpers import new_tokens, token_path

TIERS = ("H", "D")
BPT = {"H": 3, "D": 5}  # bytes per token, different per tier so a mixed-up counter shows
TOKENS = st.integers(min_value=0, max_value=3)  # small alphabet: many shared prefixes
SUFFIX = st.lists(TOKENS, min_size=0, max_size=6)
TIER = st.sampled_from(TIERS)
Prefix = tuple[int, ...]


def prefixes(seq: Prefix) -> set[Prefix]:
    return {seq[:i] for i in range(1, len(seq) + 1)}


def node_positions(node: RadixNode) -> set[Prefix]:
    """The token-path prefixes ending inside ``node``'s own edge (works detached too)."""
    path = token_path(node)
    start = len(path) - len(node.key)
    return {path[:i] for i in range(start + 1, len(path) + 1)}


def longest_in(seq: Prefix, held: set[Prefix]) -> int:
    k = 0
    while k < len(seq) and seq[: k + 1] in held:
        k += 1
    return k


def bottom_of(tree: RadixTree, tier: str) -> list[RadixNode]:
    """Nodes whose value in ``tier`` eviction may take: none of their children holds one."""
    return [n for n in tree.nodes() if tier in n.values and not any(tier in c.values for c in n.children.values())]


class RadixMachine(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        self.tree = RadixTree()
        self.present: set[Prefix] = set()
        self.held: dict[str, set[Prefix]] = {t: set() for t in TIERS}
        self.seqs: list[Prefix] = []
        self.locks: list[RadixNode] = []
        self.holders: dict[int, tuple[RadixNode, Prefix]] = {}  # holder id -> (its tip, its path)
        self.registry = SessionRegistry()

    def make_seq(self, base: int, cut: int, suffix: list[int]) -> Prefix:
        head = self.seqs[base % len(self.seqs)][:cut] if self.seqs else ()
        return head + tuple(suffix)

    def locked_positions(self) -> set[Prefix]:
        return set().union(*(prefixes(token_path(n)) for n in self.locks))

    def device_positions(self) -> set[Prefix]:
        return set().union(*(prefixes(seq) for _, seq in self.holders.values()))

    def prune_reference(self) -> None:
        """What eviction prunes: every position no value (any tier), holder or lock lies at or below."""
        anchors = self.locked_positions().union(self.device_positions(), *self.held.values())
        self.present = {p for p in self.present if any(q[: len(p)] == p for q in anchors)}

    # ----------------------------------------------------------------- rules

    @rule(tier=TIER, base=st.integers(0, 99), cut=st.integers(0, 8), suffix=SUFFIX)
    def insert(self, tier, base, cut, suffix):
        seq = self.make_seq(base, cut, suffix)
        expected_prefix = longest_in(seq, self.present)
        missing = prefixes(seq) - self.held[tier]
        asked: list[tuple[int, int]] = []
        factory = FakePayload.factory(seq, BPT[tier])

        def payload_for_range(start, end):
            asked.append((start, end))
            return factory(start, end)

        res = self.tree.insert(seq, tier, payload_for_range)
        assert res.prefix_len == expected_prefix
        assert new_tokens(res) == len(seq) - expected_prefix
        # Increments only: the tree asked exactly for the positions the tier lacked.
        asked_positions = [seq[:i] for s, e in asked for i in range(s + 1, e + 1)]
        assert len(asked_positions) == len(set(asked_positions))
        assert set(asked_positions) == missing
        if seq:
            assert token_path(res.last_node) == seq
        self.present |= prefixes(seq)
        self.held[tier] |= prefixes(seq)
        self.seqs.append(seq)

    @rule(base=st.integers(0, 99), cut=st.integers(0, 8), suffix=SUFFIX)
    def insert_structure_only(self, base, cut, suffix):
        seq = self.make_seq(base, cut, suffix)
        res = self.tree.insert(seq)
        assert res.prefix_len == longest_in(seq, self.present)
        self.present |= prefixes(seq)
        self.seqs.append(seq)

    @rule(base=st.integers(0, 99), cut=st.integers(0, 8), suffix=SUFFIX)
    def match(self, base, cut, suffix):
        seq = self.make_seq(base, cut, suffix)
        m = self.tree.match_prefix(seq)
        assert m.longest == longest_in(seq, self.present)
        assert sum(len(n.key) for n in m.path) == m.length
        assert token_path(m.last_node) == seq[: m.length]
        if m.partial_node is not None:
            assert 0 < m.partial_tokens < len(m.partial_node.key)
            assert m.partial_node.parent is m.last_node
        else:
            assert m.partial_tokens == 0
        held = m.held_span()
        assert held.longest == longest_in(seq, self.device_positions())
        deepest = held.partial_node or held.tip
        if deepest is not None:  # any holder of the deepest node holds the whole span
            assert all(seq[: held.longest] == self.holders[h][1][: held.longest] for h in deepest.holders)
        for tier in TIERS:  # one walk answers for every tier
            span = m.span(tier)
            assert span.longest == longest_in(seq, self.held[tier])
            assert all(tier in n.values for n in span.nodes)
            assert span.nodes == m.path[: len(span.nodes)]
            if span.partial_node is not None:
                assert tier in span.partial_node.values and span.partial_node is m.partial_node

    @rule(base=st.integers(0, 99), cut=st.integers(0, 8), suffix=SUFFIX)
    def lock(self, base, cut, suffix):
        seq = self.make_seq(base, cut, suffix)
        node = self.tree.match_prefix(seq).last_node
        if not node.is_root:
            self.tree.lock(node)
            self.locks.append(node)

    @rule(holder=st.integers(0, 3), base=st.integers(0, 99), cut=st.integers(0, 8), suffix=SUFFIX)
    def add_holder(self, holder, base, cut, suffix):
        seq = self.make_seq(base, cut, suffix)
        if not seq or holder in self.holders:
            return
        tip = self.tree.insert(seq).last_node
        self.tree.add_holder(tip, holder)
        self.present |= prefixes(seq)
        self.holders[holder] = (tip, seq)

    @precondition(lambda self: self.holders)
    @rule(index=st.integers(0, 99))
    def remove_holder(self, index):
        holder = sorted(self.holders)[index % len(self.holders)]
        tip, seq = self.holders.pop(holder)
        assert tip.attached and token_path(tip) == seq, "a held tip moved or was pruned"
        self.tree.remove_holder(tip, holder)
        cur = tip
        while not cur.is_root and not cur.attached:
            assert not cur.values and not cur.holders and cur.lock_ref == 0
            self.present -= node_positions(cur)
            cur = cur.parent

    @precondition(lambda self: self.locks)
    @rule(index=st.integers(0, 99))
    def unlock(self, index):
        node = self.locks.pop(index % len(self.locks))
        self.tree.unlock(node)

    def _check_eviction(self, tier, res, bytes_needed, policy, kept: set[Prefix]):
        other = {t: set(self.held[t]) for t in TIERS if t != tier}
        assert res.tier == tier
        assert res.freed_bytes == sum(v.nbytes for _, v in res.freed)
        assert res.freed_tokens == sum(len(n.key) for n, _ in res.freed)
        for node, value in res.freed:
            assert node.lock_ref == 0 and tier not in node.values
            assert value.path == token_path(node), "a freed value came off another path"
            if node.attached:
                assert not any(tier in c.values for c in node.children.values()), "evicted above a held child"
            gone = node_positions(node)
            assert gone <= self.held[tier]
            assert not gone & kept, "a locked or pinned path lost a value"
            self.held[tier] -= gone
        if res.freed and bytes_needed is not None:
            assert res.freed_bytes - res.freed[-1][1].nbytes < bytes_needed, "evicted more than needed"
        if bytes_needed != 0:
            self.prune_reference()
        for t, before in other.items():
            assert self.held[t] == before  # and the invariants check the tree still holds them
        remaining = [n for n in bottom_of(self.tree, tier) if n.lock_ref == 0 and policy.priority(n) is not None]
        if not res.satisfied:
            assert not remaining, "stopped while evictable values remain"
        elif res.freed and isinstance(policy, LRUPolicy):
            # (lifecycle classes may rank a parent below its child: no global order to check)
            stamps = [n.last_access for n, _ in res.freed]
            assert stamps == sorted(stamps), "LRU: least recently used first"
            assert all(n.last_access >= stamps[-1] for n in remaining)

    @rule(tier=TIER, bytes_needed=st.integers(0, 40))
    def evict(self, tier, bytes_needed):
        policy = LRUPolicy()
        kept = self.locked_positions()
        res = self.tree.evict(bytes_needed, tier, policy)
        self._check_eviction(tier, res, bytes_needed, policy, kept)

    @rule(
        base=st.integers(0, 99),
        cut=st.integers(0, 8),
        suffix=SUFFIX,
        session=st.sampled_from(["s0", "s1", "s2"]),
        state=st.sampled_from(CACHE_STATES),
        pin=st.booleans(),
    )
    def observe_hint(self, base, cut, suffix, session, state, pin):
        seq = self.make_seq(base, cut, suffix)
        tip = self.tree.match_prefix(seq).last_node
        self.registry.observe(CacheHint(session, state, pin), tip)

    @rule(tier=TIER, bytes_needed=st.integers(0, 40))
    def evict_lifecycle(self, tier, bytes_needed):
        policy = LifecyclePolicy(self.registry)
        kept = self.locked_positions()
        for node in self.tree.nodes():
            if self.registry.is_node_pinned(node):
                kept |= node_positions(node)
        res = self.tree.evict(bytes_needed, tier, policy)
        self._check_eviction(tier, res, bytes_needed, policy, kept)

    @rule(tier=TIER, base=st.integers(0, 99), cut=st.integers(0, 8), suffix=SUFFIX)
    def remove_value(self, tier, base, cut, suffix):
        seq = self.make_seq(base, cut, suffix)
        node = self.tree.match_prefix(seq).last_node
        if node.is_root or node.lock_ref > 0:
            return
        own = node_positions(node)
        had = tier in node.values
        others = {t: t in node.values for t in TIERS if t != tier}
        removed = self.tree.remove_value(node, tier)
        assert (removed is not None) == had
        assert all((t in node.values) == v for t, v in others.items()), "another tier's value went too"
        self.held[tier] -= own
        # Pruned: the node itself and bare ancestors that became leaves, all unlocked.
        cur = node
        while not cur.is_root and not cur.attached:
            assert not cur.values and not cur.holders and cur.lock_ref == 0
            self.present -= node_positions(cur)
            cur = cur.parent

    @rule(tier=TIER)
    def flush(self, tier):
        kept = self.locked_positions()
        res = self.tree.flush(tier)
        self._check_eviction(tier, res, None, LRUPolicy(), kept)
        assert all(n.lock_ref > 0 for n in bottom_of(self.tree, tier))

    # ------------------------------------------------------------ invariants

    @invariant()
    def tree_is_consistent(self):
        self.tree.check_invariants()

    @invariant()
    def tree_holds_exactly_the_reference(self):
        structure: set[Prefix] = set()
        held: dict[str, set[Prefix]] = {t: set() for t in TIERS}
        for node in self.tree.nodes():
            pos = node_positions(node)
            structure |= pos
            for tier, value in node.values.items():
                held[tier] |= pos
                assert value.path == token_path(node), "segment off its own radix path"
        assert structure == self.present
        assert self.tree.n_tokens == len(self.present)
        device = self.device_positions()
        for node in self.tree.nodes():  # holders exactly where their paths run
            pos = node_positions(node)
            assert node.holders == {h for h, (_, seq) in self.holders.items() if pos <= prefixes(seq)}
        assert self.tree.held_tokens == len(device), "cells held: one per distinct position"
        for tier in TIERS:
            assert held[tier] == self.held[tier]
            # Union bound: one value token per distinct cached prefix position, per tier.
            c = self.tree.tier(tier)
            assert c.payload_tokens == len(self.held[tier])
            assert c.total_bytes == BPT[tier] * len(self.held[tier])

    @invariant()
    def locks_hold(self):
        protected = set()
        for node in self.locks:
            assert node.attached and node.lock_ref > 0
            protected |= set(node.iter_up())
        for tier in TIERS:
            expected = sum(n.values[tier].nbytes for n in protected if tier in n.values)
            assert self.tree.tier(tier).protected_bytes == expected

    @invariant()
    def parents_are_never_older_than_children(self):
        for node in self.tree.nodes():
            if not node.parent.is_root:
                assert node.parent.last_access >= node.last_access


RadixMachine.TestCase.settings = settings(
    max_examples=150,
    stateful_step_count=40,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow],
)
TestRadixTreeAgainstReference = RadixMachine.TestCase
