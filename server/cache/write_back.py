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

Contracts:
- A parked copy holds KV cells until it is stored or dropped; `cells()` counts them, so the
  KV at rest is slots + resident owners + parked copies.
- `store(seq_id, tokens, final)` stores `tokens` (a prefix of the parked path) from `seq_id`,
  extracting only what the host lacks, and returns the stored path's tip, or None when the
  host declined (budget) or reading the KV failed: the copy is then dropped, as a synchronous
  store would have lost it.
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

from server.engine.llama_runtime import LlamaRuntime
from server.engine.seq_ids import SequenceIdPool, SequenceIdsExhausted
from server.engine.slots import common_prefix_len

# Tokens per piece before the KV size per token is known (the host tier learns it from its
# first stored segment): small, so the first piece cannot exceed a step's budget by much.
DEFAULT_PIECE_TOKENS = 16

Store = Callable[[int, list[int], bool], object | None]


@dataclass
class ParkedCopy:
    seq_id: int
    tokens: list[int]
    on_done: Callable[[object | None], None]
    stored: int = 0  # tokens of the path stored so far


class WriteBackQueue:
    def __init__(self, runtime: LlamaRuntime, seq_ids: SequenceIdPool, store: Store,
                 bytes_per_token: Callable[[], int], step_bytes: int):
        self.runtime = runtime
        self.seq_ids = seq_ids
        self.store = store
        self.bytes_per_token = bytes_per_token
        self.step_bytes = step_bytes
        self.queue: deque[ParkedCopy] = deque()
        self.parked = 0  # copies parked since start
        self.dropped = 0  # parked copies lost: declined by the host, or failed to read
        self.pieces = 0  # stores made from parked copies
        self.step_pieces = 0  # of which during a decoding step (bounded), not when idle

    def park(self, src_seq: int, tokens: list[int], on_done: Callable[[object | None], None]) -> bool:
        """Attach src_seq's positions [0, len(tokens)) to a parked sequence; False if not parked."""
        try:
            pid = self.seq_ids.take("parked")
        except SequenceIdsExhausted:
            return False
        self.runtime.seq_cp(src_seq, pid, 0, len(tokens))
        if self.runtime.seq_pos_min(pid) != 0 or self.runtime.seq_pos_max(pid) != len(tokens) - 1:
            self._release(pid)
            return False
        self.queue.append(ParkedCopy(pid, list(tokens), on_done))
        self.parked += 1
        return True

    def advance(self, budget: int | None = None) -> None:
        """Store at most `budget` bytes (default `step_bytes`) of the oldest parked copies, at
        least one piece when the budget is positive (a step that stored a copy at once may
        have spent it all: the queue then waits for the next step)."""
        budget = self.step_bytes if budget is None else budget
        while self.queue and budget > 0:
            budget -= self._store_piece(self.queue[0], self._piece_tokens(budget))
            self.step_pieces += 1

    def drain(self) -> None:
        """Store everything parked now (the engine is idle, or the cache is being emptied)."""
        while self.queue:
            self.finish_one()

    def finish_one(self) -> bool:
        """Store the oldest parked copy to its end and free its cells; False if none is parked."""
        if not self.queue:
            return False
        copy = self.queue[0]
        self._store_piece(copy, len(copy.tokens) - copy.stored)
        return True

    def finish_matching(self, tokens: list[int], min_tokens: int) -> None:
        """Store now every parked copy sharing at least `min_tokens` leading tokens with
        `tokens` beyond what it has stored: a request about to look for them in the host tier."""
        for copy in [c for c in self.queue if common_prefix_len(c.tokens, tokens) >= max(min_tokens, c.stored + 1)]:
            self._store_piece(copy, len(copy.tokens) - copy.stored)

    def discard(self) -> int:
        """Drop every parked copy without storing it; returns the cells freed."""
        freed = self.cells()
        while self.queue:
            self._release(self.queue.popleft().seq_id)
        return freed

    def cells(self) -> int:
        # a copy first: /metrics reads this while the engine thread changes the queue
        return sum(len(c.tokens) for c in tuple(self.queue))

    def stats(self) -> dict:
        return {"pending": len(self.queue), "pending_cells": self.cells(), "parked": self.parked,
                "dropped": self.dropped, "pieces": self.pieces, "step_pieces": self.step_pieces,
                "step_bytes": self.step_bytes}

    def _piece_tokens(self, budget: int) -> int:
        per_token = self.bytes_per_token()
        return max(1, budget // per_token) if per_token else DEFAULT_PIECE_TOKENS

    def _store_piece(self, copy: ParkedCopy, n: int) -> int:
        """Store the next `n` tokens of `copy`; returns the bytes it accounts for."""
        end = min(len(copy.tokens), copy.stored + n)
        final = end == len(copy.tokens)
        tip = self.store(copy.seq_id, copy.tokens[:end], final)
        self.pieces += 1
        nbytes = (end - copy.stored) * (self.bytes_per_token() or 1)
        copy.stored = end
        if tip is None or final:
            self.queue.remove(copy)
            self._release(copy.seq_id)
            if tip is None:
                self.dropped += 1
            copy.on_done(tip)
        return nbytes

    def _release(self, pid: int) -> None:
        self.runtime.seq_rm(pid, -1, -1)
        self.seq_ids.give("parked", pid)
