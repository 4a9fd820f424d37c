"""Restoring KV a piece at a time, so one restore never stalls the engine for more than a piece.

A restore of stored segments into a sequence (KVOps.restore) may be cut into pieces of whole tokens
at any position: each piece is written at its own positions after the ones before it. The router
restores a request's prefix piece by piece between decode steps while other requests compute
(server/cache/restore.py), and a prefetch brings KV up the same way (server/cache/prefetch.py).
"""

from __future__ import annotations

from collections import deque

from server.cache.kv_format import KVSegment


def next_piece(pending: deque[KVSegment], start: int, budget: int | None) -> KVSegment | None:
    """The next piece of `pending` (consecutive segments) from path position `start` on: a whole
    segment, or as many whole tokens of it as `budget` bytes hold (at least one); None when nothing is
    left. What the piece leaves of a segment goes back to the front of `pending`."""
    while pending:
        seg = pending.popleft()
        if seg.pos0 + seg.n_tokens <= start:
            continue  # already held
        if seg.pos0 < start:
            seg = seg.slice(start - seg.pos0, seg.n_tokens)
        if budget is not None and seg.nbytes > budget and seg.n_tokens > 1:
            n = max(1, budget * seg.n_tokens // seg.nbytes)
            seg, rest = seg.split(n)
            pending.appendleft(rest)
        return seg
    return None
