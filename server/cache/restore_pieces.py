"""Restoring KV a piece at a time, so one restore never stalls the engine for more than a piece.

A restore of stored segments into a sequence (KVOps.restore) may be cut into pieces of whole tokens
at any position: each piece is written at its own positions after the ones before it. The router
restores a request's prefix piece by piece between decode steps while other requests compute
(server/cache/restore.py), and a prefetch brings KV up the same way (server/cache/prefetch.py).
"""

from __future__ import annotations

import time
from collections import deque
from dataclasses import dataclass

from server.cache.kv_format import KVSegment
from server.cache.kv_ops import KVOps


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


@dataclass
class Restored:
    """What one `restore_pieces` call restored."""

    done: int  # the sequence holds positions [0, done) (of this path) now
    budget: int | None  # the bytes left of the budget (None: there was none)
    seconds: float = 0.0
    nbytes: int = 0  # state bytes handed to llama.cpp
    n_tokens: int = 0
    pieces: int = 0
    max_piece_s: float = 0.0


def restore_pieces(kv: KVOps, pending: deque[KVSegment], seq_id: int, done: int, budget: int | None) -> Restored:
    """Restore `pending`'s pieces into `seq_id`, which holds [0, done), until `budget` bytes are spent (None: all
    of it). Raises what KVOps.restore raises; what was restored before stays in the sequence (the caller clears it)."""
    out = Restored(done, budget)
    while out.budget is None or out.budget > 0:
        piece = next_piece(pending, out.done, out.budget)
        if piece is None:
            break
        t0 = time.perf_counter()
        result = kv.restore([piece], seq_id)
        seconds = time.perf_counter() - t0
        out.seconds += seconds
        out.max_piece_s = max(out.max_piece_s, seconds)
        out.nbytes += result.nbytes
        out.n_tokens += result.n_tokens
        out.pieces += 1
        out.done = piece.pos0 + piece.n_tokens
        if out.budget is not None:
            out.budget -= piece.nbytes
    return out
