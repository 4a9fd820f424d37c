"""Write-back spread over engine steps: a device copy about to be lost is parked, then stored
a bounded piece per step.

When a slot is taken for another prefix while other requests are decoding, its kept KV would
be gone before the next decode.
Storing all of it to host at that moment (tens of MB for a long agent history) stalls every
running stream for the whole copy; on an accelerator that is several decode steps. Instead the
slot's cells are attached to a *parked* sequence (seq_cp: llama.cpp shares the cells, nothing is
copied), the slot is free at once, and each engine step then stores at most `step_bytes` of
the parked copy (`advance`), growing the stored path piece by piece. When the engine has
nothing to decode, the rest is stored at once (`drain`).

Where the KV can be read beside the compute (`beside`: KVOps.stages, the CPU's unified KV), a
parked copy is not stored in pieces: at the step that reaches it, what the first tier lacks of
it (`held_depth`) is attached to a second parked sequence and copied out on the runtime's
transfer thread (KVOps.extract_beside) while the engine decodes; a later step, once the read is
done, stores the copy whole from that segment (the tree's insert, no copy of KV on the engine
thread), then gives both sequences back. One read runs at a time, oldest copy first. A read
that no longer reaches back to what the host holds when it is done (the host evicted part of the
path meanwhile, and the store would copy that part from the cells here) is started again, once.
A copy whose read cannot start (no second parked id, a refused snapshot) or failed is stored in
pieces as above (`read_fallbacks`). A copy the host would not admit now (`admits`: under the
predictive policy, too little of what it holds ranks below the copy's sessions) is dropped
before its read (`declined_unread`), as its store would have been declined after it.

Contracts:
- A parked copy holds KV cells until it is stored or dropped; `cells()` counts them, so the
  KV at rest is slots + resident owners + parked copies.
- `store(seq_id, tokens, final, ready, sessions)` stores `tokens` (a prefix of the parked path)
  from `seq_id`, extracting only what the host lacks (from `ready`, a segment read beforehand,
  where it covers it), tags the path with `sessions` as it is inserted (PathKV.tag: each piece is
  valued by its sessions at once, not only the last), and returns the stored path's tip, or None
  when the host declined (budget, or everything it holds outranks the path) or reading the KV
  failed: the copy is then dropped, as a synchronous store would have lost it.
- Every parked sequence id is given back on every path (`seq_ids.in_use("parked")`).
- `park` returns False (nothing parked) when no parked id is free or the copy is incomplete:
  the caller then stores synchronously, as before.
- A parked copy stays reusable: with tier S a request attaches its cells like another slot's
  (the router lists `queue` among the live sequences); without S, a request that needs its
  tokens first has it stored to the end (`finish_matching`), so the host tier holds them.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable
from dataclasses import dataclass

from server.cache.kv_format import KVSegment
from server.cache.kv_ops import ExtractError, KVOps, PendingExtract
from server.engine.llama_runtime import LlamaRuntime
from server.engine.seq_ids import SequenceIdPool, SequenceIdsExhausted
from server.engine.slots import common_prefix_len

# Tokens per piece before the KV size per token is known (the host tier learns it from its
# first stored segment): small, so the first piece cannot exceed a step's budget by much.
DEFAULT_PIECE_TOKENS = 16

# (sequence, path, final piece, a segment read beforehand, the sessions that use the path: PathKV.sessions) -> the
# stored path's tip
Store = Callable[[int, list[int], bool, KVSegment | None, tuple[str, ...]], object | None]


@dataclass
class ParkedCopy:
    seq_id: int
    tokens: list[int]
    sessions: tuple[str, ...]  # the path is tagged with them as each piece is inserted (PathKV.tag)
    stored: int = 0  # tokens of the path stored so far
    reading: PendingExtract | None = None  # its read beside the compute, in flight or done
    in_pieces: bool = False  # its read could not start or failed: stored in pieces
    reread: bool = False  # read again once: the host had lost part of what preceded the first read


class WriteBackQueue:
    def __init__(self, runtime: LlamaRuntime, seq_ids: SequenceIdPool, store: Store,
                 bytes_per_token: Callable[[], int], step_bytes: int, kv: KVOps | None = None,
                 held_depth: Callable[[list[int]], int] | None = None,
                 admits: Callable[[list[int], tuple[str, ...]], bool] | None = None):
        """`kv` and `held_depth` (the leading tokens of a path the first tier holds): copies are read beside the
        compute where `kv.stages`; without them, always in pieces. `admits(tokens, sessions)`: whether the first
        tier could take the copy now (asked before a read; None: always)."""
        self.runtime = runtime
        self.seq_ids = seq_ids
        self.store = store
        self.bytes_per_token = bytes_per_token
        self.step_bytes = step_bytes
        self.kv, self.held_depth, self.admits = kv, held_depth, admits
        self.beside = kv is not None and held_depth is not None and kv.stages
        self.queue: deque[ParkedCopy] = deque()
        self.parked = 0  # copies parked since start
        self.dropped = 0  # parked copies lost: declined by the host, or failed to read
        self.pieces = 0  # stores made from parked copies
        self.step_pieces = 0  # of which during a decoding step (bounded), not when idle
        self.reads = 0  # copies read beside the compute
        self.read_bytes = 0
        self.read_fallbacks = 0  # copies whose read could not start or failed: stored in pieces
        self.declined_unread = 0  # copies dropped before their read: the first tier would not take them

    def park(self, src_seq: int, tokens: list[int], sessions: tuple[str, ...] = ()) -> bool:
        """Attach src_seq's positions [0, len(tokens)) to a parked sequence, its stored pieces to be tagged with
        `sessions`; False if not parked."""
        try:
            pid = self.seq_ids.take("parked")
        except SequenceIdsExhausted:
            return False
        self.runtime.seq_cp(src_seq, pid, 0, len(tokens))
        if self.runtime.seq_pos_min(pid) != 0 or self.runtime.seq_pos_max(pid) != len(tokens) - 1:
            self._release(pid)
            return False
        self.queue.append(ParkedCopy(pid, list(tokens), sessions))
        self.parked += 1
        return True

    def advance(self, budget: int | None = None) -> None:
        """Store at most `budget` bytes (default `step_bytes`) of the oldest parked copies, at
        least one piece when the budget is positive (a step that stored a copy at once may
        have spent it all: the queue then waits for the next step). With `beside`: start the
        oldest copy's read, or store it (and the next ones) once read."""
        budget = self.step_bytes if budget is None else budget
        while self.queue:
            copy = self.queue[0]
            if self.beside and not copy.in_pieces:  # (reads are not held to the budget: they copy nothing here)
                if copy.reading is None:
                    if self._start_read(copy):
                        if copy.reading is not None:
                            return  # read beside the next decode, stored at a later step
                        continue  # stored (nothing to read) or dropped (the host would not take it): the next one
                elif not copy.reading.read.done():
                    return
                else:
                    self._finish_read(copy, wait=False)
                    continue
            if budget <= 0:
                return
            budget -= self._store_piece(copy, self._piece_tokens(budget))
            self.step_pieces += 1

    def drain(self) -> None:
        """Store everything parked now (the engine is idle, or the cache is being emptied)."""
        while self.queue:
            self.finish_one()

    def finish_one(self) -> bool:
        """Store the oldest parked copy to its end and free its cells; False if none is parked."""
        if not self.queue:
            return False
        self._finish(self.queue[0])
        return True

    def finish_matching(self, tokens: list[int], min_tokens: int) -> None:
        """Store now every parked copy sharing at least `min_tokens` leading tokens with
        `tokens` beyond what it has stored: a request about to look for them in the host tier."""
        for copy in [c for c in self.queue if common_prefix_len(c.tokens, tokens) >= max(min_tokens, c.stored + 1)]:
            self._finish(copy)

    def discard(self) -> int:
        """Drop every parked copy without storing it; returns the cells freed."""
        freed = self.cells()
        while self.queue:
            copy = self.queue.popleft()
            if copy.reading is not None:
                self._release(copy.reading.hold_seq)  # (waits for its read)
            self._release(copy.seq_id)
        return freed

    def cells(self) -> int:
        # a copy first: /metrics reads this while the engine thread changes the queue
        return sum(len(c.tokens) for c in tuple(self.queue))

    def stats(self) -> dict:
        return {"pending": len(self.queue), "pending_cells": self.cells(), "parked": self.parked,
                "dropped": self.dropped, "pieces": self.pieces, "step_pieces": self.step_pieces,
                "step_bytes": self.step_bytes, "beside": self.beside, "reads": self.reads,
                "read_bytes": self.read_bytes, "read_fallbacks": self.read_fallbacks,
                "declined_unread": self.declined_unread}

    def _piece_tokens(self, budget: int) -> int:
        per_token = self.bytes_per_token()
        return max(1, budget // per_token) if per_token else DEFAULT_PIECE_TOKENS

    def _finish(self, copy: ParkedCopy) -> None:
        """Store `copy` to its end now: from its read (waited for) when one was started, else in one piece."""
        if copy.reading is not None:
            self._finish_read(copy)
        else:
            self._store_piece(copy, len(copy.tokens) - copy.stored)

    def _start_read(self, copy: ParkedCopy) -> bool:
        """Start reading what the first tier lacks of `copy` beside the compute; False (and the copy goes in pieces)
        when it cannot start. A copy the first tier already holds whole is stored (nothing to read), one it would
        not take is dropped; both True, and out of the queue."""
        assert self.kv is not None and self.held_depth is not None  # (self.beside)
        start = max(copy.stored, self.held_depth(copy.tokens))
        if start >= len(copy.tokens):
            self._store_piece(copy, len(copy.tokens) - copy.stored)
            return True
        if self.admits is not None and not self.admits(copy.tokens, copy.sessions):
            self._drop(copy)  # its store would be declined: nothing read, nothing evicted for it
            self.declined_unread += 1
            return True
        try:
            hold = self.seq_ids.take("parked")
        except SequenceIdsExhausted:
            copy.in_pieces = True
            self.read_fallbacks += 1
            return False
        try:
            copy.reading = self.kv.extract_beside(copy.seq_id, start, len(copy.tokens), hold)
        except ExtractError:
            self.seq_ids.give("parked", hold)
            copy.in_pieces = True
            self.read_fallbacks += 1
            return False
        self.reads += 1
        return True

    def _finish_read(self, copy: ParkedCopy, wait: bool = True) -> None:
        """Store `copy` from its read (waiting for it), or, if the read failed, in one piece from its cells. Not
        `wait`ing (a step's advance), a read that no longer reaches back to what the host holds (the host evicted
        part of the path meanwhile: the store would copy the rest from the cells here) is started again, once."""
        reading, copy.reading = copy.reading, None
        assert reading is not None
        if not wait and not copy.reread and self.held_depth is not None \
                and self.held_depth(copy.tokens) < reading.start:
            self._release(reading.hold_seq)
            copy.reread = True
            self._start_read(copy)  # (when it cannot start, the copy goes in pieces)
            return
        self._finish_stored(copy, reading)

    def _finish_stored(self, copy: ParkedCopy, reading: PendingExtract) -> None:
        """Store `copy` whole from its read (or, the read failed, from its cells) and give the read's sequence back."""
        ready: KVSegment | None = None
        try:
            ready = segment = reading.segment()
            self.read_bytes += segment.nbytes
        except ExtractError:
            ready = None
            copy.in_pieces = True
            self.read_fallbacks += 1
        finally:
            self._release(reading.hold_seq)
        self._store_piece(copy, len(copy.tokens) - copy.stored, ready)

    def _store_piece(self, copy: ParkedCopy, n: int, ready: KVSegment | None = None) -> int:
        """Store the next `n` tokens of `copy` (what the first tier lacks of them from `ready` where it covers it);
        returns the bytes it accounts for."""
        end = min(len(copy.tokens), copy.stored + n)
        final = end == len(copy.tokens)
        tip = self.store(copy.seq_id, copy.tokens[:end], final, ready, copy.sessions)
        self.pieces += 1
        nbytes = (end - copy.stored) * (self.bytes_per_token() or 1)
        copy.stored = end
        if tip is None:
            self._drop(copy)
        elif final:
            self.queue.remove(copy)
            self._release(copy.seq_id)
        return nbytes

    def _drop(self, copy: ParkedCopy) -> None:
        """Lose `copy` unstored (the rest of it): its cells are freed."""
        self.queue.remove(copy)
        self._release(copy.seq_id)
        self.dropped += 1

    def _release(self, pid: int) -> None:
        self.runtime.seq_rm(pid, -1, -1)
        self.seq_ids.give("parked", pid)
