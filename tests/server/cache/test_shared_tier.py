"""Tier R's logic: the chained keyed names, chunking, fingerprint and secret isolation, the
value checks (MAC first, then the content), the size limit, the URL redaction, and the failure
path (store down: counted, nothing raised). The store is a real redis-server (tests/server/
cache/redis_store.py), with a password where it matters; the KV is synthetic."""

from __future__ import annotations

import logging
import socket

import numpy as np
import pytest

from harness.serving.servers import free_port
from server.cache.kv_format import KVLayout, KVSegment
from server.cache.path_kv import HeldKV
from server.cache.shared_tier import (
    MAC_BYTES,
    SharedMatch,
    SharedSecret,
    SharedTier,
    SharedTierError,
    UnauthenticatedValue,
    decode_chunk,
    encode_chunk,
)
from server.cache.store_url import redact_url
from tests.server.cache.redis_store import start_redis

LAYOUT = KVLayout(False, (1, 1), (8, 8), (1, 1), (8, 8), (0, 0))
CHUNK = 16
SECRET = "test-deployment-secret-0123456789"
KEYS = SharedSecret(SECRET)


def chunk_hashes(fp, tokens, chunk):
    return KEYS.chunk_hashes(fp, tokens, chunk)


def chunk_keys(fp, tokens, chunk):
    return KEYS.chunk_keys(fp, tokens, chunk)


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
    t = SharedTier(store.url, "fpA", CHUNK, secret=SECRET)
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


def test_keys_separate_models_without_naming_them_and_need_the_secret():
    toks = list(range(32))
    ka, kb = chunk_keys("fpA", toks, CHUNK), chunk_keys("fpB", toks, CHUNK)
    assert len({k.rsplit(":", 1)[0] for k in ka}) == 1 and ka[0].rsplit(":", 1)[0] != kb[0].rsplit(":", 1)[0]
    assert not any("fpA" in k for k in ka)  # the fingerprint is under the keyed hash only
    assert [k.rsplit(":", 1)[1] for k in ka] != [k.rsplit(":", 1)[1] for k in kb]
    # Without the secret nobody computes a prompt's key (to plant a value there, or to test
    # whether a prompt is cached): another secret names every chunk differently.
    other = SharedSecret("another-deployment-secret-xyz")
    assert not set(ka) & set(other.chunk_keys("fpA", toks, CHUNK))


def test_a_short_secret_is_refused():
    with pytest.raises(ValueError, match="at least 16 bytes"):
        SharedSecret("hunter2")


# ------------------------------------------------------------------ values
def test_a_value_decodes_only_for_its_fingerprint_path_and_position():
    toks = list(range(100, 132))
    key = chunk_keys("fpA", toks, CHUNK)[1]
    data = encode_chunk(KEYS, key, "fpA", toks, kv_for(toks, 16, 32))
    seg = decode_chunk(KEYS, key, data, "fpA", toks, 16)
    assert positions([seg]) == list(range(16, 32))
    with pytest.raises(SharedTierError, match="another model"):
        decode_chunk(KEYS, key, data, "fpB", toks, 16)
    with pytest.raises(SharedTierError, match="another token path"):
        decode_chunk(KEYS, key, data, "fpA", toks[:31] + [7], 16)
    # Every damage is caught by the MAC before anything of the value is parsed.
    for bad in (bytes(data[:-1]) + bytes([data[-1] ^ 0xFF]), data[:-8], data[:MAC_BYTES - 1], b""):
        with pytest.raises(UnauthenticatedValue, match="MAC"):
            decode_chunk(KEYS, key, bad, "fpA", toks, 16)
    # An honest value moved under another key does not verify either (the MAC covers the key).
    with pytest.raises(UnauthenticatedValue):
        decode_chunk(KEYS, chunk_keys("fpA", toks, CHUNK)[0], data, "fpA", toks, 16)


def test_a_value_without_the_deployment_secret_does_not_verify():
    toks = list(range(32))
    key = chunk_keys("fpA", toks, CHUNK)[1]
    forged = encode_chunk(SharedSecret("another-deployment-secret-xyz"), key, "fpA", toks, kv_for(toks, 16, 32))
    with pytest.raises(UnauthenticatedValue):
        decode_chunk(KEYS, key, forged, "fpA", toks, 16)


# ------------------------------------------------------------------ the store
def test_chunks_written_by_one_replica_are_found_and_read_by_another(tier, store):
    toks = list(range(1000, 1056))  # 3 whole chunks and a tail
    assert tier.store(toks, HeldKV([(0, kv_for(toks, 0, 20)), (20, kv_for(toks, 20, 56))])) is None  # queued
    tier.wait_idle()
    assert tier.stored_chunks == 3
    other = SharedTier(store.url, "fpA", CHUNK, secret=SECRET)  # a second replica of the same model
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
    tier.store(toks, HeldKV([(0, kv_for(toks, 0, 64))]))
    tier.wait_idle()
    other = SharedTier(store.url, "fpB", CHUNK, secret=SECRET)
    try:
        assert other.lookup(toks).length == 0
    finally:
        other.close()


def test_lookup_stops_at_the_first_missing_chunk(tier, store):
    import redis

    toks = list(range(64))
    tier.store(toks, HeldKV([(0, kv_for(toks, 0, 64))]))
    tier.wait_idle()
    redis.Redis.from_url(store.url).delete(chunk_keys("fpA", toks, CHUNK)[1])  # evicted by the LRU
    assert tier.lookup(toks).length == 16


def test_a_chunk_evicted_between_lookup_and_read_fails_the_read(tier, store):
    import redis

    toks = list(range(32))
    tier.store(toks, HeldKV([(0, kv_for(toks, 0, 32))]))
    tier.wait_idle()
    m = tier.lookup(toks)
    redis.Redis.from_url(store.url).flushdb()
    with pytest.raises(SharedTierError, match="evicted"):
        tier.load(m)


def test_only_covered_chunks_are_written(tier):
    toks = list(range(48))
    tier.store(toks, HeldKV([(0, kv_for(toks, 0, 20))]))  # the caller holds [0, 20) only
    tier.wait_idle()
    assert tier.stored_chunks == 1
    assert tier.lookup(toks).length == 16


# ------------------------------------------------------------------ failures
def test_a_store_that_is_down_counts_failures_and_raises_nothing():
    t = SharedTier(f"redis://127.0.0.1:{free_port()}/0", "fpA", CHUNK, secret=SECRET)  # nothing listens there
    try:
        toks = list(range(64))
        assert t.lookup(toks).length == 0
        assert t.errors == 1 and not t.available()
        assert t.lookup(toks).length == 0  # in back-off: not even asked
        assert t.errors == 1 and t.skipped == 1
        t.store(toks, HeldKV([(0, kv_for(toks, 0, 64))]))  # dropped during back-off, no exception
        assert t.stats()["pending_writes"] == 0 and t.errors == 1  # not queued, not even tried
        with pytest.raises(SharedTierError):
            t.load(SharedMatch(16, toks[:16]))
        assert t.errors == 2
    finally:
        t.close()


def test_a_store_that_accepts_but_never_answers_costs_one_timeout_then_nothing():
    with socket.socket() as listener:  # the kernel completes the handshake; nobody ever reads
        listener.bind(("127.0.0.1", 0))
        listener.listen(8)
        t = SharedTier(f"redis://127.0.0.1:{listener.getsockname()[1]}/0", "fpA", CHUNK, secret=SECRET,
                       lookup_timeout_s=0.05)
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
        t = SharedTier(s.url, "fpA", CHUNK, secret=SECRET)
        try:
            s.stop()
            toks = list(range(32))
            t.store(toks, HeldKV([(0, kv_for(toks, 0, 32))]))
            t.wait_idle()
            assert t.errors == 1 and t.stored_chunks == 0
        finally:
            t.close()
    finally:
        s.stop()  # whatever failed above, no redis-server outlives the test


# ------------------------------------------------------------------ hostile writers
def planted_value(toks: list[int], start: int, end: int) -> bytes:
    """What a writer without the secret can make: a well-formed segment (the KV of another
    prompt's positions, here all zeros) behind a MAC it had to guess."""
    from server.cache.disk_tier import encode_segment

    k, v = np.zeros((end - start, 8), np.uint8), np.zeros((end - start, 8), np.uint8)
    seg = KVSegment(LAYOUT, start, [k] * 2, [v] * 2)
    enc = encode_segment("fpA", toks[:end], seg)
    return bytes(MAC_BYTES) + b"".join([enc.head, *(a.data.cast("B") for a in enc.arrays)])


def test_a_value_planted_under_a_real_key_is_refused_counted_deleted_and_never_loaded(tier, store):
    import redis

    toks = list(range(500, 532))
    tier.store(toks, HeldKV([(0, kv_for(toks, 0, 32))]))
    tier.wait_idle()
    keys = chunk_keys("fpA", toks, CHUNK)
    client = redis.Redis.from_url(store.url)
    client.set(keys[1], planted_value(toks, 16, 32))  # overwrites the honest chunk 1
    m = tier.lookup(toks)
    assert m.length == 32  # the key exists: only reading it shows what it is
    with pytest.raises(UnauthenticatedValue):
        tier.load(m)
    assert (tier.unauthenticated, tier.rejected, tier.hits) == (1, 1, 0)
    assert client.exists(keys[1]) == 0  # deleted: the next store writes the honest value again
    assert tier.lookup(toks).length == 16
    tier.store(toks, HeldKV([(0, kv_for(toks, 0, 32))]))
    tier.wait_idle()
    assert positions(tier.load(tier.lookup(toks))) == list(range(32))
    assert tier.stats()["unauthenticated"] == 1
    # A value with no MAC at all (an older writer, or raw bytes) is refused the same way.
    client.set(keys[0], planted_value(toks, 0, 16)[MAC_BYTES:])
    with pytest.raises(UnauthenticatedValue):
        tier.load(SharedMatch(32, toks))
    assert tier.unauthenticated == 2


def test_an_oversized_value_is_refused_from_its_length_without_being_read(tier, store, monkeypatch):
    import redis

    toks = list(range(32))
    small = SharedTier(store.url, "fpA", CHUNK, secret=SECRET, max_value_bytes=4096)
    try:
        key = chunk_keys("fpA", toks, CHUNK)[0]
        redis.Redis.from_url(store.url).set(key, b"x" * (1 << 20))  # 1 MiB of garbage under a real key
        assert small.lookup(toks).length == 16
        read: list = []
        real_pipeline = small._slow.pipeline

        def spying_pipeline(*a, **kw):
            pipe = real_pipeline(*a, **kw)
            for name in ("get", "getrange", "mget"):
                orig = getattr(pipe, name)
                setattr(pipe, name, lambda *args, _o=orig, _n=name: (read.append(_n), _o(*args))[1])
            return pipe

        monkeypatch.setattr(small._slow, "pipeline", spying_pipeline)
        monkeypatch.setattr(small._slow, "mget", lambda *a: read.append("mget"))
        monkeypatch.setattr(small._slow, "get", lambda *a: read.append("get"))
        with pytest.raises(SharedTierError, match="over the 4096-byte limit"):
            small.load(SharedMatch(16, toks[:16]))
        assert read == []  # refused from STRLEN: not a byte of the value was fetched
        assert (small.oversized, small.rejected) == (1, 1)
        assert redis.Redis.from_url(store.url).exists(key) == 0
    finally:
        small.close()
    tiny = SharedTier(store.url, "fpA", CHUNK, secret=SECRET, max_value_bytes=256)  # below one chunk's value
    try:
        tiny.store(toks, HeldKV([(0, kv_for(toks, 0, 32))]))
        tiny.wait_idle()
        assert (tiny.stored_chunks, tiny.oversized_writes) == (0, 2)  # every replica would refuse them
    finally:
        tiny.close()


def test_a_value_that_grows_between_length_and_read_is_still_read_bounded(tier, store):
    import redis

    toks = list(range(16))
    small = SharedTier(store.url, "fpA", CHUNK, secret=SECRET, max_value_bytes=4096)
    try:
        key = chunk_keys("fpA", toks, CHUNK)[0]
        client = redis.Redis.from_url(store.url)
        client.set(key, b"y" * 100)
        real_pipeline = small._slow.pipeline
        calls = []

        def swapping_pipeline(*a, **kw):  # after the STRLEN round trip the value grows to 1 MiB
            calls.append(1)
            if len(calls) == 2:
                client.set(key, b"z" * (1 << 20))
            return real_pipeline(*a, **kw)

        small._slow.pipeline = swapping_pipeline
        with pytest.raises(SharedTierError, match="over the 4096-byte limit"):
            small.load(SharedMatch(16, toks))
        assert small.oversized == 1
    finally:
        small.close()


def test_the_store_needs_a_secret_and_a_wrong_password_is_counted_not_shown(tmp_path, caplog):
    import redis

    s = start_redis(tmp_path)
    try:
        redis.Redis(port=s.port).config_set("requirepass", "valkey-pass-1234")
        with pytest.raises(TypeError):
            SharedTier(s.url, "fpA", CHUNK)  # type: ignore[call-arg] - no secret, no tier
        good = f"redis://:valkey-pass-1234@127.0.0.1:{s.port}/0"
        t = SharedTier(good, "fpA", CHUNK, secret=SECRET)
        try:
            toks = list(range(32))
            t.store(toks, HeldKV([(0, kv_for(toks, 0, 32))]))
            t.wait_idle()
            assert t.stored_chunks == 2 and t.lookup(toks).length == 32
            assert "valkey-pass-1234" not in str(t.stats()) and t.stats()["url"] == f"redis://:***@127.0.0.1:{s.port}/0"
        finally:
            t.close()
        bad = SharedTier(f"redis://:wrong-password-99@127.0.0.1:{s.port}/0", "fpA", CHUNK, secret=SECRET)
        try:
            with caplog.at_level(logging.WARNING, logger="server.cache.shared_tier"):
                assert bad.lookup(list(range(32))).length == 0
            assert bad.errors == 1
            assert "wrong-password-99" not in caplog.text and "***" in caplog.text
        finally:
            bad.close()
        anon = SharedTier(s.url, "fpA", CHUNK, secret=SECRET)  # no password: the store refuses it
        try:
            assert anon.lookup(list(range(32))).length == 0 and anon.errors == 1
        finally:
            anon.close()
    finally:
        s.stop()


@pytest.mark.parametrize("url, shown", [
    ("redis://127.0.0.1:6379/0", "redis://127.0.0.1:6379/0"),
    ("redis://:s3cret@valkey:6379/0", "redis://:***@valkey:6379/0"),
    ("redis://arbor:s3cret@valkey:6379/0", "redis://arbor:***@valkey:6379/0"),
    ("rediss://s3cret@valkey:6380/1", "rediss://***@valkey:6380/1"),
    ("unix:///run/valkey.sock?db=0&password=s3cret", "unix:///run/valkey.sock?db=0&password=***"),
])
def test_the_store_url_is_shown_without_its_password(url, shown):
    assert redact_url(url) == shown


# ------------------------------------------------------------------ state checkpoints
def test_a_model_with_checkpoints_is_served_to_the_deepest_boundary_whose_state_is_stored(store):
    """On a model with sliding-window or recurrent layers, R serves a prefix only up to a chunk
    boundary whose state checkpoint the store holds too; the checkpoint is read back with the
    chunks, checked, and one planted under its key is refused and deleted."""
    import redis

    from server.cache.checkpoints import StateCheckpoint

    redis.Redis.from_url(store.url).flushdb()
    writer = SharedTier(store.url, "fpA", CHUNK, secret=SECRET, checkpoints=True)
    reader = SharedTier(store.url, "fpA", CHUNK, secret=SECRET, checkpoints=True)
    toks = list(range(2000, 2070))  # 4 whole chunks and a tail
    states = [StateCheckpoint(16, b"state at 16"), StateCheckpoint(40, b"not on a boundary"),
              StateCheckpoint(48, b"state at 48")]
    try:
        assert reader.lookup(toks).length == 0
        writer.store(toks, HeldKV([(0, kv_for(toks, 0, 64))], checkpoints=lambda align: states))
        writer.wait_idle()
        assert (writer.stored_chunks, writer.stored_checkpoints) == (4, 2)
        m = reader.lookup(toks)
        assert m.length == 48, m.length  # 4 chunks stored, the deepest state at 48
        assert positions(reader.load(m)) == list(range(48))
        assert reader.load_checkpoint(m) == StateCheckpoint(48, b"state at 48")
        # without its checkpoint, the boundary is not served: the next one down is
        client = redis.Redis.from_url(store.url)
        ckpt_keys = KEYS.checkpoint_keys("fpA", toks, CHUNK)
        client.set(ckpt_keys[2], b"x" * MAC_BYTES + b'{"fingerprint": "fpA", "pos": 48, "n": 1}\nz')  # planted
        with pytest.raises(UnauthenticatedValue):
            reader.load_checkpoint(reader.lookup(toks))
        assert client.exists(ckpt_keys[2]) == 0 and reader.unauthenticated == 1
        assert reader.lookup(toks).length == 16
        # a full-attention replica of the same fingerprint ignores the checkpoints
        plain = SharedTier(store.url, "fpA", CHUNK, secret=SECRET)
        try:
            assert plain.lookup(toks).length == 64
        finally:
            plain.close()
    finally:
        writer.close()
        reader.close()
