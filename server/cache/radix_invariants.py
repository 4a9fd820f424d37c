"""The radix tree's self-check (RadixTree.check_invariants): its structure and every counter it keeps
incrementally, recomputed from scratch. Tests and the soak call it; it is O(nodes)."""

from __future__ import annotations

from typing import Any

from server.cache.radix_results import TierCounters, TreeInvariantError


def check_invariants(tree: Any) -> None:  # a RadixTree (imported by it, so not importing it: no circle)
    """Recompute structure and counters from scratch; raise TreeInvariantError on mismatch."""

    def fail(msg: str) -> None:
        raise TreeInvariantError(msg)

    n_nodes = n_tokens = held_tokens = 0
    tiers: dict[str, TierCounters] = {name: TierCounters() for name in tree._tiers}
    stack = [tree.root]
    while stack:
        node = stack.pop()
        if not node.attached:
            fail(f"detached node reachable: {node!r}")
        if node is not tree.root:
            if not node.key:
                fail(f"empty key on {node!r}")
            n_nodes += 1
            n_tokens += len(node.key)
            if node.lock_ref < 0:
                fail(f"negative lock_ref on {node!r}")
            if node.holders:
                held_tokens += len(node.key)
            parent = node.parent
            if parent is not None and parent is not tree.root and not node.holders <= parent.holders:
                fail(f"holders of {node!r} do not cover its whole path")
            for tier, value in node.values.items():
                if value.n_tokens != len(node.key):
                    fail(f"{tier} value size {value.n_tokens} != key length on {node!r}")
                c = tiers.setdefault(tier, TierCounters())
                c.n_payloads += 1
                c.payload_tokens += value.n_tokens
                c.use(node, value, +1)
                if node.lock_ref > 0:
                    c.protected_bytes += value.nbytes
                else:
                    c.evictable_bytes += value.nbytes
        elif node.values:
            fail("the root holds a value")
        child_locks = 0
        for first, child in node.children.items():
            if child.parent is not node:
                fail(f"bad parent pointer on {child!r}")
            if not child.key or child.key[0] != first:
                fail(f"{child!r} filed under token {first}")
            child_locks += child.lock_ref
            stack.append(child)
        if node is not tree.root and node.lock_ref < child_locks:
            fail(f"{node!r} has lock_ref below its children's sum {child_locks}")
    for node in tree.nodes():
        for tier in set(node.tier_children) | {t for c in node.children.values() for t in c.values}:
            if node.tier_children.get(tier, 0) != sum(tier in c.values for c in node.children.values()):
                fail(f"{node!r}: children holding {tier} miscounted")
    for tier, bottoms in tree._bottoms.items():
        want = {n for n in tree.nodes()
                if tier in n.values and not any(tier in c.values for c in n.children.values())}
        if bottoms != want:
            fail(f"tier {tier}: evictable bottoms {sorted(n.id for n in bottoms)} != {sorted(n.id for n in want)}")
    counted, kept_counts = (n_nodes, n_tokens, held_tokens), (tree.n_nodes, tree.n_tokens, tree.held_tokens)
    if counted != kept_counts:
        fail(f"counted nodes/tokens/held tokens {counted}, kept {kept_counts}")
    kept = {name: c for name, c in tree._tiers.items()}
    for name in set(tiers) | set(kept):
        if tiers.get(name, TierCounters()) != kept.get(name, TierCounters()):
            fail(f"tier {name}: counters {kept.get(name)} != recomputed {tiers.get(name)}")
