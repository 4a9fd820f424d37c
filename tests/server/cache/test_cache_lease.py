"""The cache lease a request carries (server/cache/lease.py): its lock reference is given back
by unlock or, whatever happened, by release; a router puts it on the sequence at first sight
and takes it off when the request ends, so no table of the router outlives a request."""

from __future__ import annotations

from concurrent.futures import Future
from types import SimpleNamespace

from server.cache.lease import CacheLease, PendingLoad
from server.cache.lifecycle import CacheHint
from server.cache.router import CacheRouter
from tests.server.cache.sim_payload import simulated_tree


def test_a_lease_locks_one_tip_and_release_gives_it_back():
    tree, insert = simulated_tree(bytes_per_token=1)
    tip = insert([1, 2, 3]).last_node
    lease = CacheLease()
    with tree.mutex:
        lease.lock(tree, tip)
    assert tip.lock_ref == 1 and tree.tier("H").protected_bytes == 3
    with tree.mutex:
        lease.unlock(tree)
    assert tip.lock_ref == 0 and lease.tip is None
    with tree.mutex:
        lease.lock(tree, tip)
    lease.load = PendingLoad(cand=None, slot_seq=0, future=Future(), started=0.0)
    lease.release(tree)  # the request ended while holding both
    assert tip.lock_ref == 0 and lease.load is None and lease.tip is None
    tree.check_invariants()
    lease.lock(tree, tree.root)  # an empty match locks nothing
    assert lease.tip is None


def test_the_router_puts_the_lease_on_the_sequence_once():
    hint = CacheHint(session="s1", state="active")
    seq = SimpleNamespace(cache_lease=None, request=SimpleNamespace(cache_hint=hint))
    lease = CacheRouter.lease(seq)
    assert seq.cache_lease is lease and lease.hint is hint and not lease.deferred and lease.overhead_s == 0.0
    assert CacheRouter.lease(seq) is lease
