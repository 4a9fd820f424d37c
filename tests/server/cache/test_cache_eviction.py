"""Eviction order under LRU and lifecycle policies, and byte budgets."""

from __future__ import annotations

import pytest

from server.cache.budget import ByteBudget, enforce_budget
from server.cache.eviction import LifecycleClass, LifecyclePolicy, LRUPolicy
from server.cache.lifecycle import CacheHint, SessionRegistry
from tests.server.cache.sim_payload import simulated_tree
from tests.server.cache.tree_helpers import freed_nodes, locked


def counter():
    ticks = iter(range(1, 10_000))
    return lambda: next(ticks)


def test_lru_policy_evicts_oldest_leaf_first():
    tree, insert = simulated_tree(bytes_per_token=1, clock=counter())
    a = insert([1, 1]).last_node
    b = insert([2, 2]).last_node
    c = insert([3, 3]).last_node
    tree.match_prefix([1, 1])  # a is now the most recent
    res = tree.evict(6, "H", LRUPolicy())
    assert freed_nodes(res) == (b, c, a)


def test_lifecycle_order_done_then_active_then_tool_wait():
    tree, insert = simulated_tree(bytes_per_token=1, clock=counter())
    reg = SessionRegistry()
    policy = LifecyclePolicy(reg)
    wait = insert([1, 1]).last_node  # oldest
    done = insert([2, 2]).last_node
    plain = insert([3, 3]).last_node  # no hint at all
    active = insert([4, 4]).last_node
    finished_late = insert([5, 5]).last_node  # newest, but done
    reg.observe(CacheHint("w", "tool_wait"), wait)
    reg.observe(CacheHint("d", "done"), done)
    reg.observe(CacheHint("a", "active"), active)
    reg.observe(CacheHint("f"), finished_late)
    reg.observe(CacheHint("f", "done"))
    assert policy.classify(wait) is LifecycleClass.TOOL_WAIT
    assert policy.classify(done) is LifecycleClass.DONE
    assert policy.classify(plain) is LifecycleClass.NORMAL
    assert policy.classify(active) is LifecycleClass.NORMAL

    res = tree.evict(2, "H", policy)
    assert freed_nodes(res) == (done,)
    res = tree.evict(4, "H", policy)
    assert freed_nodes(res) == (finished_late, plain)
    res = tree.flush("H", policy)
    assert freed_nodes(res) == (active, wait), "tool_wait goes last even though it is oldest"


def test_lru_would_have_evicted_the_tool_wait_session_first():
    tree, insert = simulated_tree(bytes_per_token=1, clock=counter())
    reg = SessionRegistry()
    wait = insert([1, 1]).last_node
    insert([2, 2])
    reg.observe(CacheHint("w", "tool_wait"), wait)
    assert freed_nodes(tree.evict(1, "H", LRUPolicy())) == (wait,)


def test_pinned_session_is_never_evicted_until_done():
    tree, insert = simulated_tree(bytes_per_token=1, clock=counter())
    reg = SessionRegistry()
    policy = LifecyclePolicy(reg)
    pinned = insert([1, 2, 3]).last_node
    other = insert([1, 2, 9]).last_node
    reg.observe(CacheHint("p", "active", pin=True), pinned)
    assert policy.classify(pinned) is None and policy.classify(pinned.parent) is None
    res = tree.flush("H", policy)
    assert freed_nodes(res) == (other,)
    assert pinned.attached and pinned.parent.attached
    assert not tree.evict(100, "H", policy).satisfied

    reg.observe(CacheHint("p", "active"))  # pins are sticky
    assert policy.classify(pinned) is None
    reg.observe(CacheHint("p", "done"))
    assert not reg.is_pinned("p")
    res = tree.flush("H", policy)
    assert set(freed_nodes(res)) == {pinned, pinned.parent}
    tree.check_invariants()


def test_mixed_sessions_on_a_shared_prefix():
    tree, insert = simulated_tree(bytes_per_token=1, clock=counter())
    reg = SessionRegistry()
    policy = LifecyclePolicy(reg)
    a = insert([1, 2, 3]).last_node
    b = insert([1, 2, 4]).last_node
    shared = a.parent
    reg.observe(CacheHint("a", "done"), a)
    reg.observe(CacheHint("b", "tool_wait"), b)
    assert shared.sessions == {"a", "b"}
    assert policy.classify(shared) is LifecycleClass.TOOL_WAIT
    assert policy.classify(a) is LifecycleClass.DONE
    res = tree.evict(1, "H", policy)
    assert freed_nodes(res) == (a,)


def test_split_keeps_session_tags_on_both_halves():
    _, insert = simulated_tree(clock=counter())
    reg = SessionRegistry()
    tip = insert([1, 2, 3, 4]).last_node
    reg.observe(CacheHint("s", "tool_wait"), tip)
    insert([1, 2, 9])
    assert tip.parent.key == (1, 2) and tip.parent.sessions == {"s"} and tip.sessions == {"s"}


def test_byte_budget_over_by_and_enforce():
    budget = ByteBudget(100)
    assert budget.over_by(80) == 0 and budget.over_by(80, 30) == 10 and budget.over_by(100) == 0
    with pytest.raises(ValueError):
        ByteBudget(-1)

    tree, insert = simulated_tree(bytes_per_token=10, clock=counter())
    old = insert([1, 2, 3]).last_node  # 30 bytes
    mid = insert([4, 5, 6]).last_node  # 30 bytes
    new = insert([7, 8, 9]).last_node  # 30 bytes
    res = enforce_budget(tree, "H", ByteBudget(90), incoming_bytes=20)
    assert [node for node, _ in res.freed] == [old] and res.freed_bytes == 30 and res.satisfied
    assert tree.tier("H").total_bytes == 60
    res = enforce_budget(tree, "H", ByteBudget(90))
    assert res.freed == () and res.satisfied

    with locked(tree, mid), locked(tree, new):
        res = enforce_budget(tree, "H", ByteBudget(0))
        assert not res.satisfied and res.freed_bytes == 0
