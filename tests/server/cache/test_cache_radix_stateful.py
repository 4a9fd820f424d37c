"""Randomized operation sequences on the radix tree against a brute-force model.

The reference model is a set of token-sequence prefixes: ``present`` holds
every prefix the tree keeps as structure, ``with_payload`` the ones covered
by a payload.  Both are derived from the operations alone (insert adds all
prefixes; eviction removes the positions of the freed nodes), never from a
walk of the tree, and the tree is compared with them after every step.
"""

from __future__ import annotations

import hypothesis.strategies as st
from hypothesis import HealthCheck, settings
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

from server.cache.eviction import LifecyclePolicy, LRUPolicy
from server.cache.lifecycle import CACHE_STATES, CacheHint, SessionRegistry
from server.cache.radix_tree import RadixNode, RadixTree
from tests.server.cache.sim_payload import FakePayload

BPT = 3  # bytes per token
TOKENS = st.integers(min_value=0, max_value=3)  # small alphabet: many shared prefixes
SUFFIX = st.lists(TOKENS, min_size=0, max_size=6)


def prefixes(seq: tuple[int, ...]) -> set[tuple[int, ...]]:
    return {seq[:i] for i in range(1, len(seq) + 1)}


def node_positions(node: RadixNode) -> set[tuple[int, ...]]:
    """The token-path prefixes ending inside ``node``'s own edge (works detached too)."""
    path = node.token_path()
    start = len(path) - len(node.key)
    return {path[:i] for i in range(start + 1, len(path) + 1)}


def longest_in(seq: tuple[int, ...], held: set[tuple[int, ...]]) -> int:
    k = 0
    while k < len(seq) and seq[: k + 1] in held:
        k += 1
    return k


class RadixMachine(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        self.tree = RadixTree()
        self.present: set[tuple[int, ...]] = set()
        self.with_payload: set[tuple[int, ...]] = set()
        self.seqs: list[tuple[int, ...]] = []
        self.locks: list[RadixNode] = []
        self.registry = SessionRegistry()

    def make_seq(self, base: int, cut: int, suffix: list[int]) -> tuple[int, ...]:
        head = self.seqs[base % len(self.seqs)][:cut] if self.seqs else ()
        return head + tuple(suffix)

    # ----------------------------------------------------------------- rules

    @rule(base=st.integers(0, 99), cut=st.integers(0, 8), suffix=SUFFIX)
    def insert(self, base, cut, suffix):
        seq = self.make_seq(base, cut, suffix)
        expected_prefix = longest_in(seq, self.present)
        missing = prefixes(seq) - self.with_payload
        asked: list[tuple[int, int]] = []
        factory = FakePayload.factory(seq, BPT)

        def payload_for_range(start, end):
            asked.append((start, end))
            return factory(start, end)

        res = self.tree.insert(seq, payload_for_range)
        assert res.prefix_len == expected_prefix
        assert res.new_tokens == len(seq) - expected_prefix
        # Increments only: the tree asked exactly for the positions it lacked.
        asked_positions = [seq[:i] for s, e in asked for i in range(s + 1, e + 1)]
        assert len(asked_positions) == len(set(asked_positions))
        assert set(asked_positions) == missing
        if seq:
            assert res.last_node.token_path() == seq
        self.present |= prefixes(seq)
        self.with_payload |= prefixes(seq)
        self.seqs.append(seq)

    @rule(base=st.integers(0, 99), cut=st.integers(0, 8), suffix=SUFFIX)
    def insert_structure_only(self, base, cut, suffix):
        seq = self.make_seq(base, cut, suffix)
        res = self.tree.insert(seq, None, fill_missing=False)
        assert res.prefix_len == longest_in(seq, self.present)
        self.present |= prefixes(seq)
        self.seqs.append(seq)

    @rule(base=st.integers(0, 99), cut=st.integers(0, 8), suffix=SUFFIX, require_payload=st.booleans())
    def match(self, base, cut, suffix, require_payload):
        seq = self.make_seq(base, cut, suffix)
        held = self.with_payload if require_payload else self.present
        m = self.tree.match_prefix(seq, require_payload=require_payload)
        assert m.longest == longest_in(seq, held)
        assert sum(len(n.key) for n in m.path) == m.length
        assert m.last_node.token_path() == seq[: m.length]
        if m.partial_node is not None:
            assert 0 < m.partial_tokens < len(m.partial_node.key)
            assert m.partial_node.parent is m.last_node
            if require_payload:
                assert m.partial_node.values.get("H") is not None
        else:
            assert m.partial_tokens == 0
        if require_payload:
            assert all(n.values.get("H") is not None for n in m.path)

    @rule(base=st.integers(0, 99), cut=st.integers(0, 8), suffix=SUFFIX)
    def lock(self, base, cut, suffix):
        seq = self.make_seq(base, cut, suffix)
        node = self.tree.match_prefix(seq).last_node
        if not node.is_root:
            self.tree.lock(node)
            self.locks.append(node)

    @precondition(lambda self: self.locks)
    @rule(index=st.integers(0, 99))
    def unlock(self, index):
        node = self.locks.pop(index % len(self.locks))
        self.tree.unlock(node)

    @rule(bytes_needed=st.integers(0, 40))
    def evict(self, bytes_needed):
        locked_positions = set().union(*(prefixes(n.token_path()) for n in self.locks))
        res = self.tree.evict(bytes_needed, "H", LRUPolicy())
        stamps = [n.last_access for n in res.freed_nodes]
        assert stamps == sorted(stamps), "LRU: least recently used first"
        assert res.freed_bytes == sum(n.values["H"].nbytes for n in res.freed_nodes if n.values.get("H") is not None)
        assert res.freed_tokens == sum(len(n.key) for n in res.freed_nodes)
        for node in res.freed_nodes:
            assert not node.attached and node.lock_ref == 0
            gone = node_positions(node)
            assert gone <= self.present
            assert not gone & locked_positions, "a locked path lost a segment"
            self.present -= gone
            self.with_payload -= gone
        if res.freed_nodes:
            last = res.freed_nodes[-1]
            last_bytes = last.values["H"].nbytes if last.values.get("H") is not None else 0
            assert res.freed_bytes - last_bytes < bytes_needed, "evicted more than needed"
        if not res.satisfied:
            assert all(leaf.lock_ref > 0 for leaf in self.tree.leaves()), "stopped while evictable leaves remain"
        elif res.freed_nodes:
            # Nothing evictable left behind was older than what was taken.
            newest = stamps[-1]
            assert all(l.lock_ref > 0 or l.last_access >= newest for l in self.tree.leaves())

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

    @rule(bytes_needed=st.integers(0, 40))
    def evict_lifecycle(self, bytes_needed):
        policy = LifecyclePolicy(self.registry)
        kept = set()
        for node in self.tree.nodes():
            if self.registry.is_node_pinned(node) or node.lock_ref > 0:
                kept |= node_positions(node)
        res = self.tree.evict(bytes_needed, "H", policy)
        for node in res.freed_nodes:
            gone = node_positions(node)
            assert not gone & kept, "evicted a pinned or locked segment"
            self.present -= gone
            self.with_payload -= gone
        if not res.satisfied:
            assert all(leaf.lock_ref > 0 or policy.priority(leaf) is None for leaf in self.tree.leaves())

    @rule(base=st.integers(0, 99), cut=st.integers(0, 8), suffix=SUFFIX)
    def remove_payload(self, base, cut, suffix):
        seq = self.make_seq(base, cut, suffix)
        node = self.tree.match_prefix(seq).last_node
        if node.is_root or node.lock_ref > 0:
            return
        own = node_positions(node)
        had = node.values.get("H") is not None
        removed = self.tree.remove_payload(node)
        assert (removed is not None) == had
        self.with_payload -= own
        # Pruned: the node itself and bare ancestors that became leaves, all unlocked.
        cur = node
        while not cur.is_root and not cur.attached:
            assert cur.values.get("H") is None or cur is node
            assert cur.lock_ref == 0
            self.present -= node_positions(cur)
            cur = cur.parent

    @rule()
    def flush(self):
        res = self.tree.flush("H")
        for node in res.freed_nodes:
            self.present -= node_positions(node)
            self.with_payload -= node_positions(node)
        assert all(leaf.lock_ref > 0 for leaf in self.tree.leaves())

    # ------------------------------------------------------------ invariants

    @invariant()
    def tree_is_consistent(self):
        self.tree.check_invariants()

    @invariant()
    def tree_holds_exactly_the_reference(self):
        structure: set[tuple[int, ...]] = set()
        payload: set[tuple[int, ...]] = set()
        for node in self.tree.nodes():
            pos = node_positions(node)
            structure |= pos
            if node.values.get("H") is not None:
                payload |= pos
                assert node.values["H"].path == node.token_path(), "segment off its own radix path"
        assert structure == self.present
        assert payload == self.with_payload
        assert self.tree.n_tokens == len(self.present)
        # Union bound: one payload token per distinct cached prefix position.
        assert self.tree.tier("H").payload_tokens == len(self.with_payload)
        assert self.tree.tier("H").total_bytes == BPT * len(self.with_payload)

    @invariant()
    def locks_hold(self):
        protected = set()
        for node in self.locks:
            assert node.attached and node.lock_ref > 0
            protected |= set(node.iter_up())
        expected = sum(n.values["H"].nbytes for n in protected if n.values.get("H") is not None)
        assert self.tree.tier("H").protected_bytes == expected

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
