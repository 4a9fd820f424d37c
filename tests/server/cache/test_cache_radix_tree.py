"""Unit tests of server.cache.radix_tree (no model: FakePayload segments)."""

from __future__ import annotations

import pytest

from server.cache.radix_tree import (
    DetachedNodeError,
    NodeLockedError,
    PayloadSizeError,
    RadixTree,
    RadixTreeError,
    TreeInvariantError,
)
from tests.server.cache.sim_payload import FakePayload, simulated_tree
from tests.server.cache.tree_helpers import freed_nodes, locked, new_tokens, split_node, token_path


def assert_segments_on_own_path(tree: RadixTree) -> None:
    """Every FakePayload sits on exactly the token path it was made for."""
    for node in tree.nodes():
        if node.values.get("H") is not None:
            assert node.values["H"].path == token_path(node)


def test_insert_into_empty_tree_creates_one_segment():
    tree, insert = simulated_tree(bytes_per_token=4)
    res = insert([1, 2, 3])
    assert res.prefix_len == 0 and new_tokens(res) == 3
    assert len(res.new_nodes) == 1 and res.last_node is res.new_nodes[0]
    assert res.last_node.key == (1, 2, 3)
    assert (tree.n_nodes, tree.n_tokens, tree.tier("H").total_bytes, tree.tier("H").evictable_bytes) == (1, 3, 12, 12)
    tree.check_invariants()


def test_insert_existing_sequence_adds_nothing_and_asks_for_nothing():
    tree, insert = simulated_tree()
    insert([1, 2, 3])
    calls = []
    res = tree.insert([1, 2, 3], "H", lambda s, e: calls.append((s, e)))
    assert res.prefix_len == 3 and res.new_nodes == () and calls == []
    assert tree.n_nodes == 1


def test_branch_splits_edge_and_splits_payload_with_it():
    tree, insert = simulated_tree(bytes_per_token=2)
    first = insert([1, 2, 3, 4, 5]).last_node
    asked = []

    def factory(start, end):
        asked.append((start, end))
        return FakePayload(end - start, 2, (1, 2, 3, 9, 9)[:end])

    res = tree.insert([1, 2, 3, 9, 9], "H", factory)
    assert asked == [(3, 5)], "only the new range is requested"
    assert res.prefix_len == 3
    upper = first.parent
    assert upper is not tree.root and upper.key == (1, 2, 3)
    assert first.key == (4, 5), "the old node keeps its identity as the lower half"
    assert upper.values["H"].n_tokens == 3 and first.values["H"].n_tokens == 2
    assert upper.values["H"].tokens == (1, 2, 3) and first.values["H"].tokens == (4, 5)
    assert tree.tier("H").payload_tokens == 7 and tree.tier("H").total_bytes == 14
    assert set(upper.children) == {4, 9}
    assert_segments_on_own_path(tree)
    tree.check_invariants()


def test_insert_ending_inside_an_edge_splits_so_the_tip_ends_there():
    tree, insert = simulated_tree()
    insert([1, 2, 3, 4])
    res = insert([1, 2])
    assert res.prefix_len == 2 and res.new_nodes == ()
    assert res.last_node.key == (1, 2) and token_path(res.last_node) == (1, 2)
    assert tree.n_nodes == 2 and tree.n_tokens == 4
    assert_segments_on_own_path(tree)
    tree.check_invariants()


def test_match_prefix_full_and_partial():
    tree, insert = simulated_tree()
    a = insert([1, 2, 3]).last_node
    b = insert([1, 2, 3, 4, 5, 6]).last_node
    m = tree.match_prefix([1, 2, 3, 4, 5, 7, 8])
    assert m.length == 3 and m.path == (a,) and m.last_node is a
    assert m.partial_node is b and m.partial_tokens == 2 and m.longest == 5

    m = tree.match_prefix([1, 2, 3, 4, 5, 6, 7])
    assert m.length == 6 and m.path == (a, b) and m.partial_node is None

    m = tree.match_prefix([7])
    assert m.length == 0 and m.last_node is tree.root and m.path == ()

    m = tree.match_prefix([])
    assert m.length == 0 and m.last_node is tree.root


def test_caller_split_makes_partial_match_usable():
    tree, insert = simulated_tree()
    insert([1, 2, 3, 4, 5, 6])
    m = tree.match_prefix([1, 2, 3, 9])
    assert m.length == 0 and m.partial_tokens == 3
    upper = split_node(tree, m.partial_node, m.partial_tokens)
    assert upper.key == (1, 2, 3) and upper.values["H"].n_tokens == 3
    m2 = tree.match_prefix([1, 2, 3, 9])
    assert m2.length == 3 and m2.last_node is upper
    assert_segments_on_own_path(tree)
    tree.check_invariants()


def test_split_node_rejects_bad_offsets():
    tree, insert = simulated_tree()
    node = insert([1, 2, 3]).last_node
    for offset in (0, 3, -1):
        with pytest.raises(ValueError):
            split_node(tree, node, offset)
    with pytest.raises(ValueError):
        split_node(tree, tree.root, 1)


def test_split_of_a_locked_node_keeps_the_lock_on_both_halves():
    tree, insert = simulated_tree(bytes_per_token=1)
    tip = insert([1, 2, 3, 4]).last_node
    tree.lock(tip)
    upper = split_node(tree, tip, 2)
    assert upper.lock_ref == 1 and tip.lock_ref == 1
    assert tree.tier("H").protected_bytes == 4 and tree.tier("H").evictable_bytes == 0
    tree.unlock(tip)
    assert upper.lock_ref == 0 and tree.tier("H").protected_bytes == 0 and tree.tier("H").evictable_bytes == 4
    tree.check_invariants()


def test_value_of_wrong_size_is_rejected_and_leaves_tree_unchanged():
    tree = RadixTree()
    with pytest.raises(PayloadSizeError):
        tree.insert([1, 2, 3], "H", lambda s, e: FakePayload(2))
    assert tree.n_nodes == 0 and tree.tier("H").total_bytes == 0

    class BadSplit(FakePayload):
        def split(self, offset):
            return FakePayload(1), FakePayload(1)

    tree.insert([1, 2, 3, 4], "H", lambda s, e: BadSplit(e - s))
    with pytest.raises(PayloadSizeError):
        tree.insert([1, 2, 9])
    tree.check_invariants()
    assert tree.n_nodes == 1 and tree.match_prefix([1, 2, 3, 4]).length == 4


def test_a_tier_span_stops_at_a_hole():
    tree, insert = simulated_tree()
    insert([1, 2, 3])
    insert([1, 2, 3, 4, 5])
    insert([1, 2, 3, 4, 5, 6, 7])
    middle = tree.match_prefix([1, 2, 3, 4, 5]).last_node
    removed = tree.remove_value(middle, "H")
    assert removed is not None and removed.n_tokens == 2
    assert middle.attached, "a value-less node with children stays as structure"
    m = tree.match_prefix([1, 2, 3, 4, 5, 6, 7])
    assert m.length == 7
    span = m.span("H")
    assert span.length == 3 and span.partial_node is None and span.tip is middle.parent
    assert m.span("D").length == 0 and m.span("D").tip is None
    tree.check_invariants()


def test_insert_fills_missing_payloads_on_an_existing_path():
    tree, insert = simulated_tree()
    insert([1, 2, 3])
    insert([1, 2, 3, 4, 5])
    top = tree.match_prefix([1, 2, 3]).last_node
    tree.remove_value(top, "H")
    res = insert([1, 2, 3, 4, 5])
    assert res.filled_nodes == (top,) and res.new_nodes == ()
    assert top.values.get("H") is not None and top.values["H"].tokens == (1, 2, 3)
    res = tree.insert([1, 2, 3, 4, 5])
    assert res.filled_nodes == ()
    tree.check_invariants()


def test_remove_value_prunes_bare_leaves_up_the_path():
    tree = RadixTree()
    tree.insert([1, 2])  # structure only, no value
    tip = tree.insert([1, 2, 3, 4], "H", FakePayload.factory([1, 2, 3, 4]), fill_missing=False).last_node
    assert tree.n_nodes == 2 and tip.parent.values.get("H") is None
    tree.remove_value(tip, "H")
    assert not tip.attached and tree.n_nodes == 0 and tree.n_tokens == 0
    tree.check_invariants()


def test_remove_value_refuses_locked_and_detached_nodes():
    tree, insert = simulated_tree()
    tip = insert([1, 2]).last_node
    with locked(tree, tip), pytest.raises(NodeLockedError):
        tree.remove_value(tip, "H")
    tree.flush("H")
    with pytest.raises(DetachedNodeError):
        tree.remove_value(tip, "H")
    with pytest.raises(DetachedNodeError):
        tree.lock(tip)


def test_lock_protects_whole_path_and_counters_move():
    tree, insert = simulated_tree(bytes_per_token=1)
    insert([1, 2, 3])
    tip = insert([1, 2, 3, 4, 5]).last_node
    other = insert([1, 2, 3, 9]).last_node
    assert tree.tier("H").evictable_bytes == 6 and tree.tier("H").protected_bytes == 0
    tree.lock(tip)
    tree.lock(tip)
    assert tree.tier("H").protected_bytes == 5 and tree.tier("H").evictable_bytes == 1
    res = tree.flush("H")
    assert freed_nodes(res) == (other,) and res.freed_bytes == 1
    assert tip.attached and tree.match_prefix([1, 2, 3, 4, 5]).length == 5
    tree.unlock(tip)
    assert tree.tier("H").protected_bytes == 5
    tree.unlock(tip)
    assert tree.tier("H").protected_bytes == 0 and tree.tier("H").evictable_bytes == 5
    with pytest.raises(RadixTreeError):
        tree.unlock(tip)
    tree.check_invariants()


def test_lock_root_is_a_noop():
    tree, _ = simulated_tree()
    m = tree.match_prefix([1])
    with locked(tree, m.last_node):
        pass
    tree.check_invariants()


def test_evict_lru_order_and_cascade_to_parents():
    ticks = iter(range(1, 1000))
    tree, insert = simulated_tree(bytes_per_token=1, clock=lambda: next(ticks))
    a = insert([1, 2, 3, 4]).last_node  # t1
    b = insert([1, 2, 3, 5]).last_node  # t2, splits (1,2,3)
    c = insert([7, 8]).last_node  # t3
    shared = a.parent
    tree.match_prefix([1, 2, 3, 4])  # touches shared and a
    res = tree.evict(1, "H")
    assert freed_nodes(res) == (b,) and res.freed_bytes == 1 and res.satisfied
    res = tree.evict(3, "H")
    assert freed_nodes(res) == (c, a), "c is older than a; stop once 3 bytes are freed"
    assert res.freed_bytes == 3 and res.freed_tokens == 3
    assert shared.is_leaf and shared.attached
    res = tree.evict(100, "H")
    assert freed_nodes(res) == (shared,) and not res.satisfied
    assert tree.n_nodes == 0 and tree.tier("H").total_bytes == 0
    tree.check_invariants()


def test_evict_zero_frees_nothing_and_negative_is_an_error():
    tree, insert = simulated_tree()
    insert([1])
    assert freed_nodes(tree.evict(0, "H")) == ()
    with pytest.raises(ValueError):
        tree.evict(-1, "H")


def test_evict_returns_each_freed_value_with_its_node():
    tree = RadixTree()
    tree.insert([1, 2, 3], "H", FakePayload.factory([1, 2, 3]))
    res = tree.flush("H")
    ((node, value),) = res.freed
    assert not node.attached and "H" not in node.values and value.n_tokens == 3


def test_matched_nodes_are_touched_but_not_the_partial_one():
    ticks = iter(range(1, 1000))
    tree, insert = simulated_tree(clock=lambda: next(ticks))
    a = insert([1, 2]).last_node
    b = insert([1, 2, 3, 4]).last_node
    before = b.last_access
    m = tree.match_prefix([1, 2, 3])
    assert m.partial_node is b and b.last_access == before and a.last_access > before
    m = tree.match_prefix([1, 2], touch=False)
    assert a.last_access == m.path[0].last_access


def test_check_invariants_catches_corruption():
    tree, insert = simulated_tree()
    insert([1, 2, 3])
    tree.n_tokens += 1
    with pytest.raises(TreeInvariantError):
        tree.check_invariants()
    tree.n_tokens -= 1
    node = next(tree.nodes())
    node.values["H"] = FakePayload(2)
    with pytest.raises(TreeInvariantError):
        tree.check_invariants()


def test_fake_payload_split_keeps_paths():
    p = FakePayload(4, 3, (9, 1, 2, 3, 4))
    left, right = p.split(1)
    assert left.tokens == (1,) and left.path == (9, 1) and left.nbytes == 3
    assert right.tokens == (2, 3, 4) and right.path == p.path and right.nbytes == 9
    with pytest.raises(ValueError):
        p.split(4)


# ------------------------------------------------------------- several tiers on one node


def two_tier_tree():
    """[1, 2, 3] in H and D, [1, 2, 3, 4, 5] in H only: nodes (1, 2, 3) -> (4, 5)."""
    tree = RadixTree()
    tree.insert([1, 2, 3, 4, 5], "H", FakePayload.factory([1, 2, 3, 4, 5], 2))
    tree.insert([1, 2, 3], "D", FakePayload.factory([1, 2, 3], 7))
    return tree


def test_one_walk_says_how_far_each_tier_holds_the_prompt():
    tree = two_tier_tree()
    m = tree.match_prefix([1, 2, 3, 4, 9])
    assert (m.length, m.partial_tokens) == (3, 1)
    h, d = m.span("H"), m.span("D")
    assert (h.length, h.longest, h.partial_node) == (3, 4, m.partial_node)
    assert (d.length, d.longest, d.partial_node) == (3, 3, None)
    assert h.tip is d.tip is m.last_node
    assert tree.tier("H").total_bytes == 10 and tree.tier("D").total_bytes == 21
    tree.check_invariants()


def test_a_split_splits_every_tier_value():
    tree = two_tier_tree()
    top = tree.match_prefix([1, 2, 3]).last_node
    upper = split_node(tree, top, 1)
    assert set(upper.values) == set(top.values) == {"H", "D"}
    assert upper.values["D"].tokens == (1,) and top.values["D"].tokens == (2, 3)
    assert tree.tier("D").payload_tokens == 3 and tree.tier("D").n_payloads == 2
    tree.check_invariants()


def test_evicting_one_tier_keeps_the_others_and_prunes_only_bare_nodes():
    tree = two_tier_tree()
    top = tree.match_prefix([1, 2, 3]).last_node
    res = tree.flush("H")
    assert {n.key for n in freed_nodes(res)} == {(1, 2, 3), (4, 5)}
    assert top.attached and set(top.values) == {"D"}, "evicting H never loses D"
    assert tree.n_nodes == 1, "(4, 5) held nothing else: pruned"
    assert tree.match_prefix([1, 2, 3]).span("D").length == 3
    res = tree.flush("D")
    assert freed_nodes(res) == (top,) and not top.attached and tree.n_nodes == 0
    tree.check_invariants()


def test_eviction_takes_a_tier_from_the_bottom_of_its_paths():
    tree = two_tier_tree()
    top = tree.match_prefix([1, 2, 3]).last_node
    tree.insert([1, 2, 3, 4, 5], "D", FakePayload.factory([1, 2, 3, 4, 5], 7))
    res = tree.evict(1, "D")
    assert [n.key for n in freed_nodes(res)] == [(4, 5)], "the child's D goes before its parent's"
    assert "D" in top.values and tree.match_prefix([1, 2, 3, 4, 5]).span("H").length == 5
    tree.check_invariants()


def test_a_locked_node_keeps_its_values_in_every_tier():
    tree = two_tier_tree()
    tip = tree.match_prefix([1, 2, 3, 4, 5]).last_node
    with locked(tree, tip):
        assert tree.tier("D").protected_bytes == 21 and tree.tier("H").protected_bytes == 10
        assert tree.flush("H").freed == () and tree.flush("D").freed == ()
        with pytest.raises(NodeLockedError):
            tree.remove_value(tip.parent, "D")
    assert tree.tier("D").evictable_bytes == 21 and tree.tier("H").evictable_bytes == 10
    tree.check_invariants()


def test_removing_one_tier_value_leaves_the_node_while_another_holds_it():
    tree = two_tier_tree()
    top = tree.match_prefix([1, 2, 3]).last_node
    assert tree.remove_value(top, "H").n_tokens == 3
    assert top.attached and set(top.values) == {"D"}
    assert tree.match_prefix([1, 2, 3, 4, 5]).span("H").length == 0, "H after a hole is not usable"
    tree.check_invariants()


def test_insert_needs_a_tier_with_a_factory():
    tree = RadixTree()
    with pytest.raises(ValueError):
        tree.insert([1], "H")
    with pytest.raises(ValueError):
        tree.insert([1], None, FakePayload.factory([1]))


# ------------------------------------------------------------------- device holders


def test_holders_cover_their_path_and_one_walk_finds_them():
    tree = two_tier_tree()
    tip = tree.insert([1, 2, 3, 4]).last_node  # splits (4, 5): an owner of 4 tokens
    tree.add_holder(tip, 40)
    m = tree.match_prefix([1, 2, 3, 4, 5, 6])
    held = m.held_span()
    assert held.longest == 4 and held.tip is tip and tip.holders == {40}
    assert tip.parent.holders == {40}, "a holder holds every ancestor of its tip"
    assert tree.held_tokens == 4
    assert (m.span("H").longest, m.span("D").longest) == (5, 3)
    tree.check_invariants()


def test_eviction_keeps_holders_and_removing_the_last_holder_prunes():
    tree = RadixTree()
    tip = tree.insert([7, 8, 9]).last_node
    tree.add_holder(tip, 3)
    tree.insert([7, 8, 9], "H", FakePayload.factory([7, 8, 9]))
    tree.flush("H")
    assert tip.attached and tip.holders == {3}, "a node held on the device outlives its H value"
    tree.lock(tip)
    tree.remove_holder(tip, 3)  # the cells are gone whatever the locks say
    assert tree.held_tokens == 0 and tip.attached, "a locked node is not pruned"
    tree.unlock(tip)
    tree.flush("H")
    assert not tip.attached and tree.n_nodes == 0
    tree.check_invariants()


def test_a_split_keeps_holders_on_both_halves():
    tree = RadixTree()
    tip = tree.insert([1, 2, 3, 4]).last_node
    tree.add_holder(tip, 1)
    upper = split_node(tree, tip, 2)
    assert upper.holders == tip.holders == {1} and tree.held_tokens == 4
    tree.check_invariants()


def test_a_bare_parent_kept_by_a_lock_is_pruned_at_an_eviction_after_its_unlock():
    """A holder's path dropped while an ancestor is locked: the child goes at once, the locked
    ancestor (bare now) at the first eviction after the unlock (found by the stateful test)."""
    tree, insert = simulated_tree(bytes_per_token=1)
    parent = insert([0]).last_node
    tip = tree.insert([0, 0]).last_node
    tree.add_holder(tip, 0)
    tree.flush("H")
    tree.lock(parent)
    tree.remove_holder(tip, 0)
    assert not tip.attached and parent.attached
    tree.unlock(parent)
    tree.flush("H")
    assert not parent.attached and tree.n_nodes == 0
    tree.check_invariants()


def test_evictable_below_counts_what_evict_with_that_floor_would_take_taking_nothing():
    """A value goes only once every value under it has gone: a child ranked at or above the floor, or locked, keeps
    its parent's value too; the count matches what evict() then frees."""
    from server.cache.eviction import LRUPolicy

    tree, insert = simulated_tree()
    trunk = insert(list(range(10))).last_node
    old_leaf = insert(list(range(10)) + [50, 51]).last_node
    new_leaf = insert(list(range(10)) + [60, 61, 62]).last_node
    policy = LRUPolicy()
    floor = (new_leaf.last_access,)  # the newest leaf ranks at the floor: it stays, so its parent does
    held = tree.tier("H").evictable_bytes
    assert tree.evictable_below("H", policy, floor) == old_leaf.values["H"].nbytes
    assert tree.evictable_below("H", policy, (float("inf"),)) == held
    tree.lock(old_leaf)
    assert tree.evictable_below("H", policy, (float("inf"),)) == new_leaf.values["H"].nbytes
    tree.unlock(old_leaf)
    assert tree.tier("H").evictable_bytes == held, "nothing was taken"
    res = tree.evict(held, "H", policy, floor)
    assert [node for node, _ in res.freed] == [old_leaf] and "H" in trunk.values
    tree.check_invariants()
