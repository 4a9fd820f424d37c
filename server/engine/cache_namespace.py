"""Cache namespaces: cache isolation (vLLM's `cache_salt`, Arbor's `--cache-salt-per-key`).

A request may carry an opaque *cache namespace* (`GenerationRequest.cache_namespace`, bytes set
by the API layer from `cache_salt` and the API key). Requests in different namespaces (or one
in a namespace and one without) must never share KV, in any source, and `cached_tokens` must
never reveal another namespace's prefix.

The cache never sees a namespace beside the tokens: it sees the tokens' *cache key*. Without a
namespace the key is the token list itself (nothing changes). With one, the key is the token
list with its first token replaced by a *marker*: a negative integer, below every token id, that
encodes the namespace's 128-bit digest and the real first token. So every structure that compares
or indexes token lists keeps namespaces apart with no change of its own: a slot's kept tokens
(tier A: a slot left by another namespace shares 0 tokens), other sequences' device copies and
resident owners (S), the radix tree (H, D: a namespace's paths hang off their own first edge,
which is its own root, and every later token keeps its absolute position), the state
checkpoints' prefix digests and the in-flight deferral. What serializes tokens into fixed-width
integers (the shared store's key names, the KV events' block hashes, the checkpoints' digest)
reads the marker back with `split`: the namespace digest goes into the hash, the real first
token into the token bytes, so a salted prefix is named apart from the same tokens unsalted.
Disk files keep the marker in their JSON token path, and are reloaded into the same namespace.
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from functools import lru_cache

_BASE = 1 << 32  # every marker is <= -_BASE; token ids are 0 <= t < 2**32
_TOKEN_MASK = _BASE - 1
DIGEST_BYTES = 16


@lru_cache(maxsize=4096)
def namespace_digest(namespace: bytes) -> bytes:
    """The namespace's 128-bit digest (what markers, key names and block hashes carry)."""
    return hashlib.blake2b(namespace, digest_size=DIGEST_BYTES, person=b"arbor-cache-ns").digest()


def marker(namespace: bytes, token: int) -> int:
    """The key of first token `token` in `namespace`."""
    if not 0 <= token < _BASE:
        raise ValueError(f"token id {token} is outside 0..2**32-1")
    return -(_BASE + ((int.from_bytes(namespace_digest(namespace), "big") << 32) | token))


def is_marker(token: int) -> bool:
    return token <= -_BASE


def keyed(tokens: list[int], namespace: bytes | None) -> list[int]:
    """The cache key of `tokens` in `namespace`: `tokens` itself (the same list) without one."""
    if namespace is None or not tokens:
        return tokens
    return [marker(namespace, tokens[0]), *tokens[1:]]


def split(tokens: Sequence[int]) -> tuple[bytes | None, list[int]]:
    """A cache key back into (namespace digest or None, the real tokens)."""
    if not tokens or not is_marker(tokens[0]):
        return None, list(tokens)
    v = -tokens[0] - _BASE
    return (v >> 32).to_bytes(DIGEST_BYTES, "big"), [v & _TOKEN_MASK, *tokens[1:]]


def request_namespace(*, salt: str | None, key_id: str | None) -> bytes | None:
    """The namespace of a request with `cache_salt` `salt` authenticated by the API key whose id
    is `key_id` (under --cache-salt-per-key); None (no isolation) without either. Unambiguous:
    the salt is length-prefixed, so no (key, salt) pair spells another."""
    if salt is None and key_id is None:
        return None
    parts = [b"arbor-cache-namespace-v1"]
    if key_id is not None:
        parts.append(b"key:" + key_id.encode())
    if salt is not None:
        raw = salt.encode("utf-8", "surrogatepass")
        parts.append(b"salt:%d:" % len(raw) + raw)
    return b"|".join(parts)
