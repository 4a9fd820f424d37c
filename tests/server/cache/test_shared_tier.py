"""Tier R's logic: the chained key scheme, chunking, fingerprint isolation, the value
checks, and the failure path (store down: counted, nothing raised). The store is a real
redis-server (tests/server/cache/redis_store.py); the KV is synthetic."""

from __future__ import annotations

import socket

import numpy as np
import pytest

from bench.servers import free_port
from server.cache.kv_format import KVLayout, KVSegment
from server.cache.shared_tier import (SharedMatch, SharedTier, SharedTierError, chunk_hashes, chunk_keys,
                                      decode_chunk, encode_chunk)
from tests.server.cache.redis_store import start_redis

LAYOUT = KVLayout(False, (1, 1), (8, 8), (1, 1), (8, 8), (0, 0))
CHUNK = 16


def kv_for(tokens: list[int], start: int, end: int) -> KVSegment:
    """KV whose every row encodes (position, token), so a misplaced chunk shows."""
    rows = np.array([[p % 256, tokens[p] % 256] * 4 for p in range(start, end)], dtype=np.uint8)
    return KVSegment(LAYOUT, start, [rows.copy(), rows.copy()], [rows.copy(), rows.copy()])


def positions(segs: list[KVSegment]) -> list[int]:
    return [int(r[0]) for s in segs for r in s.k[0]]


@pytest.fixture(scope="module")
def store(tmp_path_factory):
    s = start_redis(tmp_path_factory.mktemp("redis"))
    yield s
    s.stop()


@pytest.fixture()
def tier(store):
    import redis

    redis.Redis.from_url(store.url).flushdb()
    t = SharedTier(store.url, "fpA", CHUNK)
    yield t
    t.close()


# ------------------------------------------------------------------ key scheme
def test_a_chunk_hash_chains_every_token_before_it():
    a = list(range(64))
    b = [999] + a[1:]  # differs only in the first chunk
    ha, hb = chunk_hashes("fp", a, CHUNK), chunk_hashes("fp", b, CHUNK)
    assert len(ha) == 4
    assert all(x != y for x, y in zip(ha, hb))  # later chunks' keys change too: a key names a whole prefix
    assert chunk_hashes("fp", a[:40], CHUNK) == ha[:2]  # a prefix has the same leading keys


def test_only_whole_chunks_have_keys():
    assert chunk_keys("fp", list(range(15)), CHUNK) == []
    assert len(chunk_keys("fp", list(range(47)), CHUNK)) == 2


def test_the_fingerprint_is_in_every_key_and_under_the_hash():
    toks = list(range(32))
    ka, kb = chunk_keys("fpA", toks, CHUNK), chunk_keys("fpB", toks, CHUNK)
    assert all(k.startswith("arbor:kv:fpA:") for k in ka)
    assert [k.rsplit(":", 1)[1] for k in ka] != [k.rsplit(":", 1)[1] for k in kb]


# ------------------------------------------------------------------ values
def test_a_value_decodes_only_for_its_fingerprint_path_and_position():
    toks = list(range(100, 132))
    data = encode_chunk("fpA", toks, kv_for(toks, 16, 32))
    seg = decode_chunk(data, "fpA", toks, 16)
    assert positions([seg]) == list(range(16, 32))
    with pytest.raises(SharedTierError, match="another model"):
        decode_chunk(data, "fpB", toks, 16)
    with pytest.raises(SharedTierError, match="another token path"):
        decode_chunk(data, "fpA", toks[:31] + [7], 16)
    torn = bytearray(data)
    torn[-1] ^= 0xFF
    with pytest.raises(SharedTierError, match="checksum"):
        decode_chunk(bytes(torn), "fpA", toks, 16)
    with pytest.raises(SharedTierError, match="truncated"):
        decode_chunk(data[:-8], "fpA", toks, 16)


# ------------------------------------------------------------------ the store
def test_chunks_written_by_one_replica_are_found_and_read_by_another(tier, store):
    toks = list(range(1000, 1056))  # 3 whole chunks and a tail
    assert tier.store(toks, [(0, kv_for(toks, 0, 20)), (20, kv_for(toks, 20, 56))])
    tier.wait_idle()
    assert tier.stored_chunks == 3
    other = SharedTier(store.url, "fpA", CHUNK)  # a second replica of the same model
    try:
        m = other.lookup(toks + [1, 2, 3])
        assert m.length == 48
        segs = other.load(m, start=20)  # the slot holds [0, 20) already
        assert positions(segs) == list(range(20, 48))
        assert [int(r[1]) for s in segs for r in s.k[0]] == [t % 256 for t in toks[20:48]]
    finally:
        other.close()


def test_a_replica_of_another_fingerprint_finds_nothing(tier, store):
    toks = list(range(64))
    tier.store(toks, [(0, kv_for(toks, 0, 64))])
    tier.wait_idle()
    other = SharedTier(store.url, "fpB", CHUNK)
    try:
        assert other.lookup(toks).length == 0
    finally:
        other.close()


def test_lookup_stops_at_the_first_missing_chunk(tier, store):
    import redis

    toks = list(range(64))
    tier.store(toks, [(0, kv_for(toks, 0, 64))])
    tier.wait_idle()
    redis.Redis.from_url(store.url).delete(chunk_keys("fpA", toks, CHUNK)[1])  # evicted by the LRU
    assert tier.lookup(toks).length == 16


def test_a_chunk_evicted_between_lookup_and_read_fails_the_read(tier, store):
    import redis

    toks = list(range(32))
    tier.store(toks, [(0, kv_for(toks, 0, 32))])
    tier.wait_idle()
    m = tier.lookup(toks)
    redis.Redis.from_url(store.url).flushdb()
    with pytest.raises(SharedTierError, match="evicted"):
        tier.load(m)


def test_only_covered_chunks_are_written(tier):
    toks = list(range(48))
    tier.store(toks, [(0, kv_for(toks, 0, 20))])  # the caller holds [0, 20) only
    tier.wait_idle()
    assert tier.stored_chunks == 1
    assert tier.lookup(toks).length == 16


# ------------------------------------------------------------------ failures
def test_a_store_that_is_down_counts_failures_and_raises_nothing():
    t = SharedTier(f"redis://127.0.0.1:{free_port()}/0", "fpA", CHUNK)  # nothing listens there
    try:
        toks = list(range(64))
        assert t.lookup(toks).length == 0
        assert t.errors == 1 and not t.available()
        assert t.lookup(toks).length == 0  # in back-off: not even asked
        assert t.errors == 1 and t.skipped == 1
        assert not t.store(toks, [(0, kv_for(toks, 0, 64))])  # dropped during back-off, no exception
        with pytest.raises(SharedTierError):
            t.load(SharedMatch(16, toks[:16]))
        assert t.errors == 2
    finally:
        t.close()


def test_a_store_that_accepts_but_never_answers_costs_one_timeout_then_nothing():
    with socket.socket() as listener:  # the kernel completes the handshake; nobody ever reads
        listener.bind(("127.0.0.1", 0))
        listener.listen(8)
        t = SharedTier(f"redis://127.0.0.1:{listener.getsockname()[1]}/0", "fpA", CHUNK, lookup_timeout_s=0.05)
        try:
            toks = list(range(64))
            assert t.lookup(toks).length == 0
            assert t.errors == 1 and t.lookups == 1
            assert t.lookup(toks).length == 0 and t.skipped == 1 and t.lookups == 1  # back-off: not asked
        finally:
            t.close()


def test_a_write_to_a_store_that_went_down_is_counted(tmp_path):
    s = start_redis(tmp_path)
    try:
        t = SharedTier(s.url, "fpA", CHUNK)
        try:
            s.stop()
            toks = list(range(32))
            assert t.store(toks, [(0, kv_for(toks, 0, 32))])
            t.wait_idle()
            assert t.errors == 1 and t.stored_chunks == 0
        finally:
            t.close()
    finally:
        s.stop()  # whatever failed above, no redis-server outlives the test
