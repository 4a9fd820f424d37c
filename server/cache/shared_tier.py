"""Tier R: KV chunks in a shared Redis/Valkey store, read by every replica of one model.

Not on the radix tree: the store is shared, so what it holds changes under every replica's
feet; each admission asks it instead (`lookup`) and a restore reads what it found (`load`).

Keys (LMCache's scheme): a prompt is cut into chunks of `chunk` tokens from position 0;
chunk i's hash chains chunk i-1's hash with chunk i's token ids,

    h_0 = sha256(fingerprint | tokens[0:c]),  h_i = sha256(h_{i-1} | tokens[i*c:(i+1)*c])
    key_i = "arbor:kv:{fingerprint}:{h_i}"

so one key names one whole token prefix, and the model's fingerprint (model file, KV types,
layout: server/cache/fingerprint.py) is both in the key and under the hash: replicas of
another model or KV layout never even see each other's keys. Only whole chunks are stored;
the partial tail of a prompt is computed (as LMCache does).

Values: the disk tier's self-describing segment encoding (server/cache/disk_tier.py:
magic, a checksummed JSON header with the fingerprint, the token path up to the chunk's
end, its start and the KV layout, then the raw K/V arrays with their SHA-256). A read checks
all of it against the prompt it is for, so a hash collision, a torn value or another
model's value is refused (counted), never restored.

Contracts:
- `lookup` runs on the engine thread at admission: one pipelined EXISTS per candidate chunk,
  one round trip, under a short socket timeout (`lookup_timeout_s`, 50 ms by default; a
  local store answers in well under a millisecond). Any failure counts in `errors` and
  opens a back-off (`BACKOFF_S`) during which the store is not asked at all, so a store that
  is down or slow costs the engine at most one timeout per back-off period.
- `load` runs on the router's read-ahead thread (never the engine thread): one MGET.
- `store` never waits: it queues the chunks' KV (views, bytes bounded by `queue_bytes`;
  beyond it the store is dropped and counted) for a writer thread that checks which chunks
  the store lacks and SETs them, no TTL: the store's own `maxmemory` policy (allkeys-lru)
  bounds what it keeps.
- Nothing here raises into a request: store failures only count; `load` raises
  SharedTierError, which the router turns into computing the prompt.
"""

from __future__ import annotations

import hashlib
import json
import logging
import struct
import time
from dataclasses import dataclass

import numpy as np

from server.cache.bounded_writer import BoundedWriter
from server.cache.disk_tier import DIGEST_BYTES, MAGIC, MAX_HEADER, cover, encode_segment, layout_from_json
from server.cache.kv_format import KVLayout, KVSegment, segment_from_arrays

log = logging.getLogger(__name__)

TIER = "R"
# bench/shared_chunk.py: reads run at the same rate from 32 tokens a chunk up, the computed tail
# (chunk/2 on average) dominates from 64 up, and 64 keeps a lookup under 0.5 ms per 4k tokens.
DEFAULT_CHUNK = 64
DEFAULT_LOOKUP_TIMEOUT_S = 0.05
DEFAULT_IO_TIMEOUT_S = 2.0
DEFAULT_QUEUE_BYTES = 64 << 20
BACKOFF_S = 5.0  # after a failure the store is left alone this long


class SharedTierError(RuntimeError):
    """A shared-store read failed or returned a value that is not the asked chunk."""


def chunk_hashes(fingerprint: str, tokens: list[int], chunk: int) -> list[str]:
    """The chained hashes of the whole chunks of `tokens` (the partial tail has none)."""
    out, parent = [], fingerprint.encode()
    for i in range(len(tokens) // chunk):
        h = hashlib.sha256(parent)
        h.update(np.asarray(tokens[i * chunk:(i + 1) * chunk], dtype="<i4").tobytes())
        parent = h.digest()
        out.append(h.hexdigest())
    return out


def chunk_keys(fingerprint: str, tokens: list[int], chunk: int) -> list[str]:
    return [f"arbor:kv:{fingerprint}:{h}" for h in chunk_hashes(fingerprint, tokens, chunk)]


def encode_chunk(fingerprint: str, path_tokens: list[int], seg: KVSegment) -> bytes:
    """A chunk's value: the disk segment encoding of `seg` (the KV of path_tokens[seg.pos0:])."""
    enc = encode_segment(fingerprint, path_tokens, seg)
    return b"".join([enc.head, *(a.data.cast("B") for a in enc.arrays)])


def decode_chunk(data: bytes, fingerprint: str, path_tokens: list[int], start: int) -> KVSegment:
    """The KV of path_tokens[start:] from a chunk's value, checked against everything it must
    be: the format, both checksums, the fingerprint, the token path and the position."""
    head = len(MAGIC) + 4
    if len(data) < head or data[:len(MAGIC)] != MAGIC:
        raise SharedTierError("not an Arbor KV chunk (another format version, or garbage)")
    (hlen,) = struct.unpack_from("<I", data, len(MAGIC))
    if hlen > MAX_HEADER or len(data) < head + hlen + DIGEST_BYTES:
        raise SharedTierError("the chunk ends inside its header (torn value)")
    raw = data[head:head + hlen]
    if hashlib.sha256(raw).digest() != data[head + hlen:head + hlen + DIGEST_BYTES]:
        raise SharedTierError("chunk header checksum mismatch")
    try:
        header = json.loads(raw)
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise SharedTierError("unreadable chunk header") from exc
    if not isinstance(header, dict):
        raise SharedTierError("unreadable chunk header")
    if header.get("fingerprint") != fingerprint:
        raise SharedTierError("a chunk of another model or KV layout")
    if header.get("tokens") != list(path_tokens) or header.get("start") != start:
        raise SharedTierError("the chunk holds another token path (hash collision?)")
    n = len(path_tokens) - start
    layout: KVLayout = layout_from_json(header["layout"])
    body = memoryview(data)[head + hlen + DIGEST_BYTES:]
    if header.get("n") != n or len(body) != n * int(layout.bytes_per_token):
        raise SharedTierError("chunk size does not match its header (truncated value)")
    if hashlib.sha256(body).hexdigest() != header.get("sha256"):
        raise SharedTierError("chunk body checksum mismatch")
    return segment_from_arrays(layout, start, n, body)  # read-only views: a restore only reads them


@dataclass(frozen=True)
class SharedMatch:
    """`length` leading tokens (whole chunks) of `tokens` found in the store."""

    length: int
    tokens: list[int]


class SharedTier:
    name = TIER

    def __init__(self, url: str, fingerprint: str, chunk: int = DEFAULT_CHUNK, *,
                 lookup_timeout_s: float = DEFAULT_LOOKUP_TIMEOUT_S, io_timeout_s: float = DEFAULT_IO_TIMEOUT_S,
                 queue_bytes: int = DEFAULT_QUEUE_BYTES):
        try:
            import redis  # imported here: only a server with the shared tier talks to a store
        except ImportError as exc:
            raise RuntimeError("--cache-shared needs the PyPI package redis: pip install redis") from exc

        self.url = url
        self.fingerprint = fingerprint
        self.chunk = chunk
        self.queue_bytes = queue_bytes
        # Two clients: lookups run on the engine thread under a short timeout; reads and writes
        # move whole chunks on background threads under a longer one.
        self._fast = redis.Redis.from_url(url, socket_timeout=lookup_timeout_s,
                                          socket_connect_timeout=lookup_timeout_s)
        self._slow = redis.Redis.from_url(url, socket_timeout=io_timeout_s, socket_connect_timeout=io_timeout_s)
        self._down_until = 0.0
        self.lookups = 0
        self.lookup_ms = 0.0  # total time of lookups (engine thread)
        self.max_lookup_ms = 0.0
        self.hits = 0
        self.errors = 0  # every failed store call: lookup, read, write (the metric)
        self.skipped = 0  # lookups not made during a back-off
        self.rejected = 0  # values read that were not the chunk asked for
        self.stored_chunks = 0
        self._writer = BoundedWriter("arbor-shared-writer", lambda item: self._write(*item),
                                     lambda exc: self._failed("write", exc), queue_bytes)

    # ------------------------------------------------------------------ failures
    def _failed(self, what: str, exc: Exception) -> None:
        self.errors += 1
        self._down_until = time.monotonic() + BACKOFF_S
        log.warning("shared KV store %s: %s failed (%s: %s); computing instead, retrying in %.0f s",
                    self.url, what, type(exc).__name__, exc, BACKOFF_S)

    def available(self) -> bool:
        return time.monotonic() >= self._down_until

    # ------------------------------------------------------------------ lookup
    def lookup(self, tokens: list[int]) -> SharedMatch:
        """The leading whole chunks of `tokens` the store holds (engine thread, bounded time;
        0 when the store fails or is in back-off)."""
        keys = chunk_keys(self.fingerprint, tokens, self.chunk)
        if not keys:
            return SharedMatch(0, [])
        if not self.available():
            self.skipped += 1
            return SharedMatch(0, [])
        t0 = time.perf_counter()
        try:
            pipe = self._fast.pipeline(transaction=False)
            for k in keys:
                pipe.exists(k)
            found = pipe.execute()
        except Exception as exc:  # noqa: BLE001 - any store failure costs the cache only
            self._failed("lookup", exc)
            return SharedMatch(0, [])
        finally:
            ms = (time.perf_counter() - t0) * 1000.0
            self.lookups += 1
            self.lookup_ms += ms
            self.max_lookup_ms = max(self.max_lookup_ms, ms)
        n = next((i for i, x in enumerate(found) if not x), len(found))
        return SharedMatch(n * self.chunk, list(tokens[:n * self.chunk]))

    # ------------------------------------------------------------------ read
    def load(self, match: SharedMatch, start: int = 0) -> list[KVSegment]:
        """The KV of positions [start, match.length) as consecutive segments, read in one
        MGET and checked (read-ahead thread). Raises SharedTierError."""
        if start >= match.length:
            return []
        first = start // self.chunk
        keys = chunk_keys(self.fingerprint, match.tokens, self.chunk)[first:]
        try:
            values = self._slow.mget(keys)
        except Exception as exc:  # noqa: BLE001
            self._failed("read", exc)
            raise SharedTierError(f"reading {len(keys)} chunks failed: {exc}") from exc
        out = []
        for j, data in enumerate(values):
            i = first + j
            if data is None:
                raise SharedTierError(f"chunk {i} was evicted from the store before it was read")
            try:
                seg = decode_chunk(data, self.fingerprint, match.tokens[:(i + 1) * self.chunk], i * self.chunk)
            except (SharedTierError, ValueError, KeyError, TypeError) as exc:
                self.rejected += 1
                raise SharedTierError(f"chunk {i}: {exc}") from exc
            out.append(seg.slice(start - seg.pos0, seg.n_tokens) if seg.pos0 < start else seg)
        self.hits += 1
        return out

    # ------------------------------------------------------------------ write
    def store(self, tokens: list[int], ranges: list[tuple[int, KVSegment]]) -> bool:
        """Queue the whole chunks of `tokens` that `ranges` ((start, segment) pairs, e.g. a
        host path's H values) cover, for the writer. Never waits; a full queue drops it."""
        n = (len(tokens) // self.chunk) * self.chunk
        if n == 0 or not self.available():
            return False
        return self._writer.submit((list(tokens[:n]), ranges), sum(seg.nbytes for _, seg in ranges))

    @property
    def dropped_writes(self) -> int:
        """Stores dropped because the writer's queue was full."""
        return self._writer.dropped

    def _write(self, tokens: list[int], ranges: list[tuple[int, KVSegment]]) -> None:
        """SET the chunks the store lacks (one EXISTS round trip, then one pipeline of SETs)."""
        keys = chunk_keys(self.fingerprint, tokens, self.chunk)
        pipe = self._slow.pipeline(transaction=False)
        for k in keys:
            pipe.exists(k)
        present = pipe.execute()
        pipe = self._slow.pipeline(transaction=False)
        wrote = 0
        for i, (key, have) in enumerate(zip(keys, present)):
            if have:
                continue
            s, e = i * self.chunk, (i + 1) * self.chunk
            seg = cover(ranges, s, e)
            if seg is None:
                continue  # the caller does not hold this chunk's KV
            pipe.set(key, encode_chunk(self.fingerprint, tokens[:e], seg))
            wrote += 1
        if wrote:
            pipe.execute()
            self.stored_chunks += wrote

    def wait_idle(self) -> None:
        """Block until every queued write is done (tests, benchmarks, shutdown)."""
        self._writer.wait_idle()

    def close(self) -> None:
        self._writer.close(timeout=10)
        self._fast.close()
        self._slow.close()

    def stats(self) -> dict:
        """Counters, read without any lock (a scrape never waits for the store)."""
        return {"url": self.url, "chunk_tokens": self.chunk, "available": self.available(),
                "lookups": self.lookups, "lookup_ms_total": round(self.lookup_ms, 3),
                "max_lookup_ms": round(self.max_lookup_ms, 3), "lookups_skipped": self.skipped,
                "hits": self.hits, "errors": self.errors, "rejected": self.rejected,
                "stored_chunks": self.stored_chunks, "dropped_writes": self.dropped_writes,
                "pending_bytes": self._writer.pending_bytes, "pending_writes": self._writer.pending}
