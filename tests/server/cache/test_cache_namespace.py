"""Cache isolation without a model (server/engine/cache_namespace.py, `cache_salt`): a request's
tokens under a namespace are a cache key whose first token is the namespace's marker, so every
source keeps namespaces apart: the slots (A), other sequences' device copies and resident owners
(S), the radix tree (H, D: a per-namespace first edge, positions unchanged), the state
checkpoints, the shared store's key names (R), the in-flight deferral and the KV events. Without
a namespace every key, hash and digest is what it was."""

from __future__ import annotations

import hashlib
import hmac
from types import SimpleNamespace

import numpy as np
import pytest

from server.cache.checkpoint_store import CheckpointStore, prefix_digest
from server.cache.checkpoints import StateCheckpoint
from server.cache.disk_tier import DiskTier
from server.cache.eviction import LRUPolicy
from server.cache.kv_events import block_hash, stored_blocks
from server.cache.path_kv import HeldKV
from server.cache.planner import defer_behind
from server.cache.radix_tree import RadixTree
from server.cache.shared_tier import SharedSecret
from server.cache.tiers import Source
from server.engine.cache_namespace import is_marker, keyed, marker, request_namespace, split
from server.engine.sampling_params import SamplingParams
from server.engine.sequence import GenerationRequest, SeqStatus, Sequence
from server.engine.slots import SlotPool
from tests.server.cache.sim_payload import FakePayload, simulated_tree
from tests.server.cache.test_disk_tier import kv_for, positions
from tests.server.cache.test_planner import PROMPT, SimResident, by_source, planner, store

A, B = request_namespace(salt="alice", key_id=None), request_namespace(salt="bob", key_id=None)


def test_keys_markers_and_their_inverse():
    assert keyed(PROMPT, None) is PROMPT and keyed([], A) == []  # no namespace: the same list
    ka = keyed(PROMPT, A)
    assert ka[1:] == PROMPT[1:] and len(ka) == len(PROMPT) and is_marker(ka[0]) and ka[0] < -(1 << 32)
    assert ka[0] != keyed(PROMPT, B)[0] and ka[0] != marker(A, 1)  # per namespace and first token
    ns, tokens = split(ka)
    assert tokens == PROMPT and ns is not None and len(ns) == 16 and split(keyed(PROMPT, B))[0] != ns
    assert split(PROMPT) == (None, PROMPT)
    with pytest.raises(ValueError):
        marker(A, -1)


def test_request_namespaces_are_unambiguous():
    assert request_namespace(salt=None, key_id=None) is None
    seen = {request_namespace(salt=s, key_id=k)
            for s, k in [("a", None), (None, "a"), ("a", "b"), ("b", "a"), ("a|salt:1:b", None), ("b", None)]}
    assert len(seen) == 6


def _seq(prompt, namespace=None, n_past=0, status=SeqStatus.PREFILLING):
    req = GenerationRequest(prompt_tokens=prompt, sampling=SamplingParams(), max_tokens=4, cache_namespace=namespace)
    s = Sequence(req, lambda e: None)
    s.n_past, s.status = n_past, status
    return s


def test_a_sequence_names_its_kv_by_its_namespace():
    plain, salted = _seq(PROMPT), _seq(PROMPT, A)
    assert plain.cache_prompt is plain.prompt and salted.prompt == PROMPT  # the runner computes the real tokens
    assert salted.cache_prompt == keyed(PROMPT, A)
    salted.n_past = plain.n_past = 50
    assert plain.kv_tokens() == PROMPT[:50] and salted.kv_tokens() == keyed(PROMPT[:50], A)


def test_a_slot_left_by_another_namespace_shares_nothing():
    pool = SlotPool([0])
    slot, _ = pool.acquire(keyed(PROMPT, A), reuse=True)
    pool.release(slot, keyed(PROMPT[:150], A))
    for prompt, want in [(keyed(PROMPT, B), 0), (PROMPT, 0), (keyed(PROMPT, A), 150)]:
        slot, lcp = pool.acquire(prompt, reuse=True)
        assert lcp == want
        pool.release(slot, keyed(PROMPT[:150], A))
    pool.release(slot, PROMPT[:150])  # left without a namespace: a salted prompt shares nothing
    assert pool.acquire(keyed(PROMPT, A), reuse=True)[1] == 0


def test_the_tree_separates_namespaces_without_moving_positions():
    p, tree = planner("AHD", route="longest")
    store(tree, "H", keyed(PROMPT[:150], A))
    store(tree, "D", PROMPT[:120])
    ranges = []
    with tree.mutex:  # a namespace's segment covers the same positions as the plain one
        tree.insert(keyed(PROMPT[:180], B), "H", lambda s, e: ranges.append((s, e)) or FakePayload(e - s, 2))
    assert ranges == [(0, 180)]
    assert by_source(p.candidates(keyed(PROMPT, A), 0)) == {Source.A: 0, Source.H: 150, Source.D: 0}
    assert by_source(p.candidates(keyed(PROMPT, B), 0)) == {Source.A: 0, Source.H: 180, Source.D: 0}
    assert by_source(p.candidates(PROMPT, 0)) == {Source.A: 0, Source.H: 0, Source.D: 120}
    other = request_namespace(salt="carol", key_id=None)
    assert by_source(p.candidates(keyed(PROMPT, other), 0)) == {Source.A: 0, Source.H: 0, Source.D: 0}
    # three first edges under the root: one per namespace, one without
    assert len(tree.root.children) == 3
    tree.check_invariants()


def test_device_copies_of_another_namespace_are_no_source():
    p, _ = planner("AS", route="longest")
    live = [(7, keyed(PROMPT[:100], A)), (8, PROMPT[:90])]
    assert by_source(p.candidates(keyed(PROMPT, A), 0, live))[Source.S] == 100
    assert by_source(p.candidates(keyed(PROMPT, B), 0, live))[Source.S] == 0
    assert by_source(p.candidates(PROMPT, 0, live))[Source.S] == 90


def test_resident_owners_are_found_through_the_namespaced_walk():
    p, tree = planner("ASH", route="longest", resident=SimResident(0))

    class Resident:  # as ResidentOwners.take: what the walk's held span covers
        def take(self, m):
            span = m.span("H")
            return (span.longest, SimpleNamespace(seq_id=40)) if span.longest else (0, None)

    p.resident = Resident()
    store(tree, "H", keyed(PROMPT[:100], A))
    assert by_source(p.candidates(keyed(PROMPT, A), 0))[Source.S] == 100
    assert by_source(p.candidates(keyed(PROMPT, B), 0))[Source.S] == 0


def test_no_deferral_behind_another_namespace():
    new_a, new_b, new_plain = _seq(PROMPT[:150] + [1], A), _seq(PROMPT[:150] + [1], B), _seq(PROMPT[:150] + [1])
    computing = _seq(PROMPT, A, n_past=10)
    assert defer_behind(new_a, [computing], min_tokens=64)
    assert not defer_behind(new_b, [computing], min_tokens=64)
    assert not defer_behind(new_plain, [computing], min_tokens=64)
    assert defer_behind(new_plain, [_seq(PROMPT, n_past=10)], min_tokens=64)


def test_checkpoints_are_kept_per_namespace():
    assert prefix_digest(PROMPT, 50) == hashlib.blake2b(np.asarray(PROMPT[:50], dtype=np.int32).tobytes(),
                                                        digest_size=16).digest()  # unsalted: as before
    store_ = CheckpointStore(1 << 20)
    store_.put(keyed(PROMPT, A), StateCheckpoint(50, b"x" * 10))
    assert store_.best(keyed(PROMPT, A), 100) is not None
    assert store_.best(keyed(PROMPT, B), 100) is None and store_.best(PROMPT, 100) is None
    assert len({prefix_digest(keyed(PROMPT, A), 50), prefix_digest(keyed(PROMPT, B), 50),
                prefix_digest(PROMPT, 50)}) == 3


def test_shared_store_keys_include_the_namespace():
    keys = SharedSecret(b"s" * 32)
    plain = keys.chunk_hashes("fp", PROMPT, 64)
    # unsalted: the chain of before (fingerprint, then each chunk's int32 bytes)
    parent, want = b"fp", []
    names = hmac.digest(b"s" * 32, b"arbor shared kv v1: key names", "sha256")
    for i in range(3):
        parent = hmac.digest(names, parent + b"|" + np.asarray(PROMPT[i * 64:(i + 1) * 64], "<i4").tobytes(), "sha256")
        want.append(parent.hex())
    assert plain == want
    ha, hb = keys.chunk_hashes("fp", keyed(PROMPT, A), 64), keys.chunk_hashes("fp", keyed(PROMPT, B), 64)
    assert len(ha) == len(hb) == 3 and not set(ha) & set(hb) and not set(ha) & set(plain)
    assert keys.chunk_hashes("fp", keyed(PROMPT[:130], A), 64) == ha[:2]  # a prefix keeps its keys


def test_kv_events_hash_the_namespace_and_announce_the_real_tokens():
    tree, _ = simulated_tree(bytes_per_token=2)
    with tree.mutex:
        tree.insert(PROMPT[:32], "H", FakePayload.factory(PROMPT[:32]))
        tree.insert(keyed(PROMPT[:32], A), "H", FakePayload.factory(keyed(PROMPT[:32], A)))
    blocks = stored_blocks(tree, 16)
    assert len(blocks) == 4
    firsts = [b for b in blocks.values() if b.parent is None]
    assert [b.tokens for b in firsts] == [tuple(PROMPT[:16])] * 2  # real token ids in both
    assert block_hash(None, tuple(PROMPT[:16])) in blocks  # unsalted: the hash of before
    assert block_hash(None, tuple(PROMPT[:16]), split(keyed(PROMPT, A))[0]) in blocks


def test_disk_files_keep_their_namespace_across_a_restart(tmp_path):
    a = keyed(list(range(200, 260)), A)
    tier = DiskTier(RadixTree(), tmp_path / "kv", 1 << 20, "fp", LRUPolicy())
    tier.store(a, HeldKV([(0, kv_for(a, 0, len(a)))]))
    tier.wait_idle()
    tier.close()
    tier = DiskTier(RadixTree(), tmp_path / "kv", 1 << 20, "fp", LRUPolicy())
    try:
        m = tier.match(a)
        assert m.length == len(a)
        assert [p for s in tier.load(m) for p in positions(s)] == list(range(len(a)))
        assert tier.match(keyed(list(range(200, 260)), B)).length == 0
        assert tier.match(list(range(200, 260))).length == 0
    finally:
        tier.close()


@pytest.fixture(scope="module")
def redis_url(tmp_path_factory):
    from tests.server.cache.redis_store import start_redis

    s = start_redis(tmp_path_factory.mktemp("redis"))
    yield s.url
    s.stop()


def test_the_shared_store_serves_a_namespace_its_own_chunks_only(redis_url):
    from server.cache.shared_tier import SharedTier
    from tests.server.cache.test_shared_tier import SECRET
    from tests.server.cache.test_shared_tier import kv_for as chunk_kv

    writer, reader = SharedTier(redis_url, "fpNS", 16, secret=SECRET), SharedTier(redis_url, "fpNS", 16, secret=SECRET)
    try:
        toks = keyed(list(range(1000, 1048)), A)
        writer.store(toks, HeldKV([(0, chunk_kv(toks, 0, 48))]))
        writer.wait_idle()
        assert writer.stored_chunks == 3
        m = reader.lookup(toks)
        assert m.length == 48 and len(reader.load(m, start=0)) > 0
        assert reader.lookup(keyed(list(range(1000, 1048)), B)).length == 0
        assert reader.lookup(list(range(1000, 1048))).length == 0
    finally:
        writer.close()
        reader.close()
