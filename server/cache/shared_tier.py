"""Tier R: KV chunks in a shared Redis/Valkey store, read by every replica of one model.

Not on the radix tree: the store is shared, so what it holds changes under every replica's
feet; each admission asks it instead (`lookup`) and a restore reads what it found (`load`).

Authentication (issue 35): whoever can write to the store must not be able to plant KV that
replicas restore. Every replica of a deployment holds one secret (`--cache-shared-secret`);
two sub-keys are derived from it (HMAC-SHA256 of the secret over a label, one per use):

- key names: a prompt is cut into chunks of `chunk` tokens from position 0 and chunk i's
  name chains chunk i-1's (LMCache's scheme, keyed):

      h_0 = HMAC(k_names, fingerprint | tokens[0:c]),  h_i = HMAC(k_names, h_{i-1} | tokens[i*c:(i+1)*c])
      key_i = "arbor:kv:{ns}:{h_i}",  ns = HMAC(k_names, "ns" | fingerprint)[:16 bytes]

  so one key names one whole token prefix of one model (fingerprint: model file, KV types,
  layout; server/cache/fingerprint.py), yet a key reveals neither the fingerprint nor
  anything a writer without the secret could use to compute the key of a prompt it knows
  (and so to test whether it is cached, or to aim a value at it). A replica with another
  secret or model uses other names: it never sees these values. Rotating the secret starts
  an empty namespace; the old one ages out under the store's LRU.
- values: `MAC | value`, MAC = HMAC(k_values, key | value), checked before anything of the
  value is parsed. A value that fails (planted, torn, moved under another key) is refused,
  counted (`unauthenticated`), deleted from the store (a replica with the secret writes the
  honest one again) and never restored.

Only whole chunks are stored; the partial tail of a prompt is computed (as LMCache does).
The value under the MAC is the disk tier's self-describing segment encoding (server/cache/
segment_format.py: magic, a checksummed JSON header with the fingerprint, the token path up to the
chunk's end, its start and the KV layout, then the raw K/V arrays), checked against the prompt
it is for as well, so a hash collision or another model's value is refused too (counted).

Size: a value longer than `max_value_bytes` is refused from its length (STRLEN) before any of
it is read, and the read itself asks for at most `max_value_bytes + 1` bytes (GETRANGE), so a
value swapped for a larger one between the two cannot make a replica read more than that.

Contracts:
- `lookup` runs on the engine thread at admission: one pipelined EXISTS per candidate chunk,
  one round trip, under a short socket timeout (`lookup_timeout_s`, 50 ms by default; a
  local store answers in well under a millisecond). Any failure counts in `errors` and
  opens a back-off (`BACKOFF_S`) during which the store is not asked at all, so a store that
  is down or slow costs the engine at most one timeout per back-off period.
- `load` runs on the router's read-ahead thread (never the engine thread): two pipelined
  round trips (the values' lengths, then the values, each bounded by `max_value_bytes`).
- `store` never waits: it queues the chunks' KV (a `PathKV`'s ranges: H's values on the path,
  views; bytes bounded by `queue_bytes`;
  beyond it the store is dropped and counted) for a writer thread that checks which chunks
  the store lacks and SETs them, no TTL: the store's own `maxmemory` policy (allkeys-lru)
  bounds what it keeps. A value longer than `max_value_bytes` is not written (counted).
- The store's URL is shown only through `redact_url` (its password as `***`).
- Nothing here raises into a request: store failures only count; `load` raises
  SharedTierError, which the router turns into computing the prompt.
"""

from __future__ import annotations

import hmac
import json
import logging
import time
from dataclasses import dataclass
from typing import cast

import numpy as np

from server.cache.bounded_writer import BoundedWriter
from server.cache.checkpoints import StateCheckpoint
from server.cache.kv_format import KVSegment, cut, segment_from_arrays
from server.cache.segment_format import DiskSegmentError, check_header, encode_segment, parse_segment
from server.cache.store_url import password_of, redact_url
from server.cache.tiers import PathKV, Source
from server.engine.cache_namespace import split

log = logging.getLogger(__name__)

TIER = Source.R
# bench/shared_chunk.py: reads run at the same rate from 32 tokens a chunk up, the computed tail
# (chunk/2 on average) dominates from 64 up, and 64 keeps a lookup under 0.5 ms per 4k tokens.
DEFAULT_CHUNK = 64
DEFAULT_LOOKUP_TIMEOUT_S = 0.05
DEFAULT_IO_TIMEOUT_S = 2.0
DEFAULT_QUEUE_BYTES = 64 << 20
BACKOFF_S = 5.0  # after a failure the store is left alone this long
DEFAULT_MAX_VALUE_BYTES = 64 << 20
MAC_BYTES = 32  # HMAC-SHA256 in front of every value
# A secret shorter than this is a password someone typed, not a key (use `openssl rand -hex 32`).
MIN_SECRET_BYTES = 16


class SharedTierError(RuntimeError):
    """A shared-store read failed or returned a value that is not the asked chunk."""


class SharedSecret:
    """The deployment secret's two sub-keys: one names keys, one MACs values (a leaked key
    name or MAC says nothing about the other key, nor about the secret)."""

    def __init__(self, secret: bytes | str):
        raw = secret.encode() if isinstance(secret, str) else bytes(secret)
        if len(raw) < MIN_SECRET_BYTES:
            raise ValueError(f"the shared-store secret must be at least {MIN_SECRET_BYTES} bytes "
                             "(e.g. `openssl rand -hex 32`)")
        self._names = hmac.digest(raw, b"arbor shared kv v1: key names", "sha256")
        self._values = hmac.digest(raw, b"arbor shared kv v1: value mac", "sha256")

    def __repr__(self) -> str:
        return "SharedSecret(***)"

    def namespace(self, fingerprint: str) -> str:
        """The keys' prefix for one model: stable per (secret, fingerprint), reveals neither."""
        return hmac.digest(self._names, b"ns|" + fingerprint.encode(), "sha256")[:16].hex()

    def chunk_hashes(self, fingerprint: str, tokens: list[int], chunk: int) -> list[str]:
        """The chained keyed hashes of the whole chunks of `tokens` (the partial tail has none).
        A cache namespace's tokens (server/engine/cache_namespace.py) chain from the fingerprint
        and the namespace, so its keys name no prefix of another namespace or of none."""
        out, parent = [], fingerprint.encode()
        namespace, tokens = split(tokens)
        if namespace is not None:
            parent += b"|namespace|" + namespace
        ids = np.asarray(tokens[:(len(tokens) // chunk) * chunk], dtype="<i4").tobytes()
        step = 4 * chunk
        for i in range(len(tokens) // chunk):
            parent = hmac.digest(self._names, parent + b"|" + ids[i * step:(i + 1) * step], "sha256")
            out.append(parent.hex())
        return out

    def chunk_keys(self, fingerprint: str, tokens: list[int], chunk: int) -> list[str]:
        ns = self.namespace(fingerprint)
        return [f"arbor:kv:{ns}:{h}" for h in self.chunk_hashes(fingerprint, tokens, chunk)]

    def checkpoint_keys(self, fingerprint: str, tokens: list[int], chunk: int) -> list[str]:
        """Key i names the state checkpoint after the whole prefix of chunks 0..i (a model with
        sliding-window or recurrent layers): the chunk chain's hash, under another prefix."""
        ns = self.namespace(fingerprint)
        return [f"arbor:ckpt:{ns}:{h}" for h in self.chunk_hashes(fingerprint, tokens, chunk)]

    def mac(self, key: str, parts: list) -> bytes:
        """HMAC of `key` and the value's bytes (`parts`, buffers in order, not joined)."""
        m = hmac.new(self._values, key.encode() + b"\n", "sha256")
        for p in parts:
            m.update(p)
        return m.digest()

    def verify(self, key: str, data: bytes | memoryview) -> memoryview:
        """The value under the MAC of `data` read from `key`; SharedTierError if it does not verify."""
        view = memoryview(data)
        if len(view) < MAC_BYTES or not hmac.compare_digest(self.mac(key, [view[MAC_BYTES:]]), view[:MAC_BYTES]):
            raise UnauthenticatedValue("the value's MAC does not verify (not written by a replica holding "
                                       "this deployment's secret, or damaged)")
        return view[MAC_BYTES:]


class UnauthenticatedValue(SharedTierError):
    """A value whose MAC does not verify under this deployment's secret: never parsed, never loaded."""


class OversizedValue(SharedTierError):
    """A value longer than the replica's `max_value_bytes`: refused before it is read."""


def encode_chunk(secret: SharedSecret, key: str, fingerprint: str, path_tokens: list[int], seg: KVSegment) -> bytes:
    """A chunk's value under `key`: the MAC, then the disk segment encoding of `seg` (the KV
    of path_tokens[seg.pos0:])."""
    enc = encode_segment(fingerprint, path_tokens, seg)
    parts: list[bytes | memoryview] = [enc.head, *(a.data.cast("B") for a in enc.arrays)]
    return b"".join([secret.mac(key, parts), *parts])


def decode_chunk(secret: SharedSecret, key: str, data: bytes | memoryview, fingerprint: str, path_tokens: list[int],
                 start: int) -> KVSegment:
    """The KV of path_tokens[start:] from the value read under `key`, checked against
    everything it must be: first its MAC (nothing unauthenticated is parsed), then the
    format, the header checksum, the fingerprint, the token path, the position and the size.
    (The body's own SHA-256 is not recomputed: the MAC already covers every byte of it.)"""
    data = secret.verify(key, data)
    try:
        header, offset = parse_segment(data, "chunk")
        tokens, layout = check_header("chunk", header, fingerprint, len(data), offset)
    except DiskSegmentError as exc:
        raise SharedTierError(str(exc)) from exc
    if tokens != list(path_tokens) or header["start"] != start:
        raise SharedTierError("the chunk holds another token path (hash collision?)")
    return segment_from_arrays(layout, start, len(tokens) - start, data[offset:])  # read-only views


def encode_checkpoint(secret: SharedSecret, key: str, fingerprint: str, ckpt: StateCheckpoint) -> bytes:
    """A state checkpoint's value under `key`: the MAC, a JSON header line (fingerprint,
    position, length), then the llama.cpp partial state."""
    head = json.dumps({"fingerprint": fingerprint, "pos": ckpt.pos, "n": len(ckpt.blob)}).encode() + b"\n"
    return b"".join([secret.mac(key, [head, ckpt.blob]), head, ckpt.blob])


def decode_checkpoint(secret: SharedSecret, key: str, data: bytes | memoryview, fingerprint: str,
                      pos: int) -> StateCheckpoint:
    """The checkpoint after `pos` tokens from the value read under `key`: its MAC first, then
    the model, the position and the length it must have."""
    body = bytes(secret.verify(key, data))
    head, _, blob = body.partition(b"\n")
    try:
        header = json.loads(head)
    except ValueError as exc:
        raise SharedTierError(f"the checkpoint's header does not parse: {exc}") from exc
    if header.get("fingerprint") != fingerprint:
        raise SharedTierError("the checkpoint is another model's")
    if header.get("pos") != pos or header.get("n") != len(blob):
        raise SharedTierError(f"the checkpoint is at {header.get('pos')} with {len(blob)} bytes, not at {pos}")
    return StateCheckpoint(pos, blob)


@dataclass(frozen=True)
class SharedMatch:
    """`length` leading tokens (whole chunks) of `tokens` found in the store; on a model with
    sliding-window or recurrent layers, `checkpoint_key` names the state after them."""

    length: int
    tokens: list[int]
    checkpoint_key: str | None = None


class SharedTier:
    """A `KVTier` (server/cache/tiers.py)."""

    source = TIER

    def __init__(self, url: str, fingerprint: str, chunk: int = DEFAULT_CHUNK, *, secret: bytes | str | SharedSecret,
                 lookup_timeout_s: float = DEFAULT_LOOKUP_TIMEOUT_S, io_timeout_s: float = DEFAULT_IO_TIMEOUT_S,
                 queue_bytes: int = DEFAULT_QUEUE_BYTES, max_value_bytes: int = DEFAULT_MAX_VALUE_BYTES,
                 checkpoints: bool = False):
        """`secret`: the deployment's shared secret (required: a store without it would trust
        whoever can write to it). `max_value_bytes`: the longest value read or written.
        `checkpoints`: the model has sliding-window or recurrent layers, so a prefix is served
        only up to a chunk boundary the store also holds the state checkpoint of."""
        self.checkpoints = checkpoints
        try:
            import redis  # imported here: only a server with the shared tier talks to a store
        except ImportError as exc:
            raise RuntimeError("--cache-shared needs the PyPI package redis: pip install redis") from exc

        self.secret = secret if isinstance(secret, SharedSecret) else SharedSecret(secret)
        self.url = redact_url(url)  # the only form of the URL kept for showing
        self._password = password_of(url)
        self.fingerprint = fingerprint
        self.max_value_bytes = max_value_bytes
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
        self.rejected = 0  # values read that were refused (any reason below, or not the chunk asked for)
        self.unauthenticated = 0  # of which: the MAC did not verify (planted or damaged)
        self.oversized = 0  # of which: longer than max_value_bytes (refused from their length)
        self.oversized_writes = 0  # chunks not written: their value would exceed max_value_bytes
        self.stored_chunks = 0
        self.stored_checkpoints = 0
        self._writer = BoundedWriter("arbor-shared-writer", lambda item: self._write(*item),
                                     lambda exc: self._failed("write", exc), queue_bytes)

    # ------------------------------------------------------------------ failures
    def _failed(self, what: str, exc: Exception) -> None:
        self.errors += 1
        self._down_until = time.monotonic() + BACKOFF_S
        log.warning("shared KV store %s: %s failed (%s: %s); computing instead, retrying in %.0f s",
                    self.url, what, type(exc).__name__, self._scrub(exc), BACKOFF_S)

    def _scrub(self, exc: Exception) -> str:
        """An error's text without the store's password (in case a client library quotes it)."""
        text = str(exc)
        return text.replace(self._password, "***") if self._password else text

    def available(self) -> bool:
        return time.monotonic() >= self._down_until

    # ------------------------------------------------------------------ lookup
    def lookup(self, tokens: list[int], walk: object = None) -> SharedMatch:
        """The leading whole chunks of `tokens` the store holds (engine thread, bounded time;
        0 when the store fails or is in back-off). Not on the radix tree: `walk` is unused."""
        keys = self.secret.chunk_keys(self.fingerprint, tokens, self.chunk)
        if not keys:
            return SharedMatch(0, [])
        if not self.available():
            self.skipped += 1
            return SharedMatch(0, [])
        ckpt_keys = self.secret.checkpoint_keys(self.fingerprint, tokens, self.chunk) if self.checkpoints else []
        t0 = time.perf_counter()
        try:
            pipe = self._fast.pipeline(transaction=False)
            for k in keys + ckpt_keys:
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
        chunks, states = found[:len(keys)], found[len(keys):]
        n = next((i for i, x in enumerate(chunks) if not x), len(chunks))
        if not self.checkpoints:
            return SharedMatch(n * self.chunk, list(tokens[:n * self.chunk]))
        # the deepest boundary within the chunks found whose state is there too
        n = next((i + 1 for i in range(n - 1, -1, -1) if states[i]), 0)
        return SharedMatch(n * self.chunk, list(tokens[:n * self.chunk]), ckpt_keys[n - 1] if n else None)

    # ------------------------------------------------------------------ read
    def load(self, match: SharedMatch, start: int = 0) -> list[KVSegment]:
        """The KV of positions [start, match.length) as consecutive segments, checked
        (read-ahead thread). Two round trips: every value's length (STRLEN: an oversized one
        is refused before any of it is read), then the values (GETRANGE up to
        max_value_bytes + 1: bounded even if a value grew in between). Raises
        SharedTierError; a value refused for its MAC or size is deleted from the store."""
        if start >= match.length:
            return []
        first = start // self.chunk
        keys = self.secret.chunk_keys(self.fingerprint, match.tokens, self.chunk)[first:]
        try:
            pipe = self._slow.pipeline(transaction=False)
            for k in keys:
                pipe.strlen(k)
            sizes = pipe.execute()
            for j, size in enumerate(sizes):
                if size > self.max_value_bytes:
                    self._refuse(keys[j], OversizedValue(
                        f"chunk {first + j}: a {size}-byte value, over the {self.max_value_bytes}-byte limit"))
                if size == 0:
                    raise SharedTierError(f"chunk {first + j} was evicted from the store before it was read")
            pipe = self._slow.pipeline(transaction=False)
            for k in keys:
                pipe.getrange(k, 0, self.max_value_bytes)  # at most max_value_bytes + 1 bytes
            values = pipe.execute()
        except SharedTierError:
            raise
        except Exception as exc:
            self._failed("read", exc)
            raise SharedTierError(f"reading {len(keys)} chunks failed: {self._scrub(exc)}") from exc
        out = []
        for j, data in enumerate(values):
            i = first + j
            if not data:
                raise SharedTierError(f"chunk {i} was evicted from the store before it was read")
            if len(data) > self.max_value_bytes:
                self._refuse(keys[j], OversizedValue(f"chunk {i}: over the {self.max_value_bytes}-byte limit"))
            try:
                seg = decode_chunk(self.secret, keys[j], data, self.fingerprint, match.tokens[:(i + 1) * self.chunk],
                                   i * self.chunk)
            except UnauthenticatedValue as exc:
                self._refuse(keys[j], UnauthenticatedValue(f"chunk {i}: {exc}"))
            except (SharedTierError, ValueError, KeyError, TypeError) as exc:
                self.rejected += 1
                raise SharedTierError(f"chunk {i}: {exc}") from exc
            out.append(seg.slice(start - seg.pos0, seg.n_tokens) if seg.pos0 < start else seg)
        self.hits += 1
        return out

    def load_checkpoint(self, match: SharedMatch) -> StateCheckpoint:
        """The state checkpoint a match ends at (read-ahead thread), checked as chunks are;
        raises SharedTierError."""
        key = match.checkpoint_key
        if key is None:
            raise SharedTierError("the match has no state checkpoint")
        try:
            data = cast(bytes, self._slow.getrange(key, 0, self.max_value_bytes))  # a sync client
        except Exception as exc:
            self._failed("read", exc)
            raise SharedTierError(f"reading the checkpoint failed: {self._scrub(exc)}") from exc
        if not data:
            raise SharedTierError("the checkpoint was evicted from the store before it was read")
        if len(data) > self.max_value_bytes:
            self._refuse(key, OversizedValue(f"checkpoint: over the {self.max_value_bytes}-byte limit"))
        try:
            return decode_checkpoint(self.secret, key, data, self.fingerprint, match.length)
        except UnauthenticatedValue as exc:
            self._refuse(key, UnauthenticatedValue(f"checkpoint: {exc}"))
            raise  # not reached: _refuse raises
        except SharedTierError:
            self.rejected += 1
            raise

    # ------------------------------------------------------------------ write
    def store(self, tokens: list[int], kv: PathKV) -> None:
        """Queue the whole chunks of `tokens` that `kv`'s ranges cover (all it holds: which
        chunks the store lacks is asked on the writer thread), for the writer, with the path's
        checkpoints at chunk boundaries (a model with sliding-window or recurrent layers).
        Never waits; a full queue drops it. None: nothing to hand on."""
        n = (len(tokens) // self.chunk) * self.chunk
        if n == 0 or not self.available():
            return None
        ranges = kv.read(0, len(tokens))
        states = [c for c in kv.checkpoints(self.chunk) if c.pos % self.chunk == 0 and 0 < c.pos <= n]
        self._writer.submit((list(tokens[:n]), ranges, states),
                            sum(seg.nbytes for _, seg in ranges) + sum(c.nbytes for c in states))
        return None

    def _refuse(self, key: str, exc: SharedTierError) -> None:
        """Count a value refused for its MAC or its size, delete it (best effort: a replica
        holding the secret then writes the honest value again, instead of every lookup finding
        the bad one until the LRU drops it), and raise `exc`."""
        self.rejected += 1
        if isinstance(exc, OversizedValue):
            self.oversized += 1
        else:
            self.unauthenticated += 1
        log.warning("shared KV store %s: %s; refused and deleted, computing instead", self.url, exc)
        try:
            self._slow.delete(key)
        except Exception as del_exc:  # noqa: BLE001 - the refusal stands either way
            log.debug("shared KV store: deleting a refused value failed: %s", self._scrub(del_exc))
        raise exc

    @property
    def dropped_writes(self) -> int:
        """Stores dropped because the writer's queue was full."""
        return self._writer.dropped

    def _write(self, tokens: list[int], ranges: list[tuple[int, KVSegment]],
               states: list[StateCheckpoint] | None = None) -> None:
        """SET the chunks and checkpoints the store lacks (one EXISTS round trip, then one
        pipeline of SETs)."""
        keys = self.secret.chunk_keys(self.fingerprint, tokens, self.chunk)
        ckpt_keys = self.secret.checkpoint_keys(self.fingerprint, tokens, self.chunk) if states else []
        wanted = [(ckpt_keys[c.pos // self.chunk - 1], c) for c in states or ()]
        pipe = self._slow.pipeline(transaction=False)
        for k in keys + [k for k, _ in wanted]:
            pipe.exists(k)
        found = pipe.execute()
        present, states_present = found[:len(keys)], found[len(keys):]
        pipe = self._slow.pipeline(transaction=False)
        wrote = chunks = 0
        for (key, ckpt), have in zip(wanted, states_present):
            if have:
                continue
            value = encode_checkpoint(self.secret, key, self.fingerprint, ckpt)
            if len(value) > self.max_value_bytes:
                self.oversized_writes += 1
                continue
            pipe.set(key, value)
            wrote += 1
        checkpoints = wrote
        for i, (key, have) in enumerate(zip(keys, present)):
            if have:
                continue
            s, e = i * self.chunk, (i + 1) * self.chunk
            parts = cut(ranges, s, e)
            if not parts:
                continue  # the caller does not hold this chunk's KV
            seg = KVSegment.join(parts)
            value = encode_chunk(self.secret, key, self.fingerprint, tokens[:e], seg)
            if len(value) > self.max_value_bytes:
                self.oversized_writes += 1  # every replica would refuse it
                continue
            pipe.set(key, value)
            wrote += 1
            chunks += 1
        if wrote:
            pipe.execute()
            self.stored_chunks += chunks
            self.stored_checkpoints += checkpoints

    def wait_idle(self) -> None:
        """Block until every queued write is done (tests, benchmarks, shutdown)."""
        self._writer.wait_idle()

    def evict(self, nbytes: int) -> int:
        """Nothing: the store is every replica's, and its own LRU (`maxmemory`) bounds it."""
        return 0

    def flush(self) -> int:
        """Nothing, as `evict` (POST /cache/flush empties this replica's tiers only)."""
        return 0

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
                "unauthenticated": self.unauthenticated, "oversized": self.oversized,
                "oversized_writes": self.oversized_writes, "max_value_bytes": self.max_value_bytes,
                "stored_chunks": self.stored_chunks, "stored_checkpoints": self.stored_checkpoints,
                "checkpoints": self.checkpoints, "dropped_writes": self.dropped_writes,
                "pending_bytes": self._writer.pending_bytes, "pending_writes": self._writer.pending}
