"""Continuous batching: which tokens of which sequences go into the next decode.

Every step first takes one decode token from each generating sequence, then fills the
rest of the batch budget with prompt chunks of sequences still prefilling, oldest first.
So a long prompt is split across steps and never holds other requests' decoding back by
more than one chunk; `prefill_while_decoding` makes that chunk smaller while anyone decodes.
Pure logic: no llama.cpp here (tested with a simulated runner).

KV cells: the unified KV is one pool, so any slot may grow to the whole context. Admission
reserves each request's prompt plus its reserved output (`GenerationRequest.reserved_cells`)
against `kv_cells`; a request that does not fit waits (first come, first served) until
running ones finish. Reservations ignore sharing, so they are an upper bound of what the
running requests need; cells held by idle slots and resident prefixes are not reserved and
give way when the pool runs short (see Engine).

Prefill stops: a prompt chunk never runs past the next of `Sequence.prefill_stops`, so the
state at that position exists for a moment and can be checkpointed (models with sliding-window
or recurrent layers; server/cache/checkpoints.py).
"""

from __future__ import annotations

import bisect
import sys
from collections import deque
from collections.abc import Callable
from contextlib import AbstractContextManager, nullcontext
from dataclasses import dataclass, field

from server.engine.sequence import SeqStatus, Sequence
from server.engine.slots import Slot, SlotPool


class QueueFull(RuntimeError):
    """More requests wait than the queue allows; the API answers 503 + Retry-After."""


@dataclass
class StepItem:
    """A run of consecutive tokens of one sequence in the next batch."""

    seq: Sequence
    tokens: list[int]
    start_pos: int
    sample: bool  # take logits at the last token and sample the next one
    # speculative decoding (server/engine/speculative/): tokens drafted after a decode token, which `tokens`
    # then ends with; every row of the item has logits, and the runner verifies them
    draft: list[int] = field(default_factory=list)
    # tokens whose KV the step kept, set by the runner when it verified a draft (None: all of `tokens`)
    kept: int | None = None


@dataclass(frozen=True)
class Admission:
    seq: Sequence
    slot: Slot
    common_prefix: int  # tokens the slot's kept KV shares with the prompt (0 with reuse off)


class Scheduler:
    def __init__(self, slots: SlotPool, *, max_batch_tokens: int, max_waiting: int, reuse: bool,
                 kv_cells: int | None = None, defer: Callable[[Sequence], bool] | None = None,
                 prefill_while_decoding: int | None = None):
        if max_batch_tokens < len(slots.slots):
            raise ValueError("the batch must fit at least one decode token per slot")
        # Prompt tokens a step may carry while other sequences decode (None: the rest of the
        # batch). A step's time grows with its tokens, so this bounds how long one prompt's
        # chunk holds every stream's next token back; prompts alone still take whole batches.
        self.prefill_while_decoding = prefill_while_decoding
        self.kv_cells = kv_cells  # cells running requests may reserve in all (None: no limit)
        self.slots = slots
        self.max_batch_tokens = max_batch_tokens
        self.max_waiting = max_waiting
        self.reuse = reuse
        self.waiting: deque[Sequence] = deque()
        self.running: list[Sequence] = []  # admission order
        # Asked before admitting a waiting sequence: True keeps it waiting this step (the
        # cache router uses it for in-flight sharing). Later arrivals may be admitted meanwhile.
        self.defer = defer

    # ------------------------------------------------------------- admission
    def add(self, seq: Sequence) -> None:
        if self.kv_cells is not None and seq.reserved_cells > self.kv_cells:
            # The API refuses such requests first (context_length_exceeded); this guards the
            # contract, since a request that can never be admitted would wait forever.
            raise ValueError(f"the request needs {seq.reserved_cells} KV cells; the pool has {self.kv_cells}")
        if len(self.waiting) >= self.max_waiting:
            raise QueueFull(f"{len(self.waiting)} requests are already waiting for a slot")
        self.waiting.append(seq)

    def admit_one(self, lock: AbstractContextManager = nullcontext()) -> Admission | None:
        """Give a free slot to the first waiting sequence that is not deferred, if any.

        The engine prepares each admission (its KV reuse) before asking for the next one,
        so a deferral decision always sees what earlier admissions really hold. Only the
        engine thread admits; other threads only append to `waiting` (`add`), so the
        choice (prompt comparisons, deferral) runs without `lock`, which is taken only to
        read the queue and to move the chosen sequence from `waiting` to `running`.
        """
        if not self.slots.idle:
            return None
        with lock:
            waiting = list(self.waiting)
        for seq in waiting:
            if self.defer is not None and self.defer(seq):
                continue
            if not self.fits(seq):
                return None  # first come, first served: later requests do not overtake it
            got = self.slots.acquire(seq.cache_prompt, reuse=self.reuse)  # another namespace's slot shares 0
            if got is None:
                return None
            slot, lcp = got
            seq.slot = slot
            seq.status = SeqStatus.PREFILLING
            with lock:
                self.waiting.remove(seq)
                self.running.append(seq)
            return Admission(seq, slot, lcp)
        return None

    @property
    def reserved_cells(self) -> int:
        return sum(s.reserved_cells for s in self.running)

    def fits(self, seq: Sequence) -> bool:
        return self.kv_cells is None or self.reserved_cells + seq.reserved_cells <= self.kv_cells

    def preemption_victim(self) -> Sequence | None:
        """Whom to stop when the KV pool is full and nothing else gives way: the newest
        request that grew past its reservation, else the newest request."""
        past = [s for s in self.running if s.past_reservation]
        pool = past or self.running
        return pool[-1] if pool else None

    def take_cancelled(self) -> list[Sequence]:
        """Remove and return cancelled sequences (waiting ones never got a slot)."""
        gone = [s for s in self.waiting if s.cancelled] + [s for s in self.running if s.cancelled]
        if gone:
            self.waiting = deque(s for s in self.waiting if not s.cancelled)
            self.running = [s for s in self.running if not s.cancelled]
        return gone

    # ------------------------------------------------------------------ steps
    def plan(self) -> list[StepItem]:
        budget = self.max_batch_tokens
        items: list[StepItem] = []
        for seq in self.running:
            if seq.status is SeqStatus.DECODING:
                items.append(StepItem(seq, [seq.output[-1]], seq.n_past, sample=True))
                budget -= 1
        if items and self.prefill_while_decoding is not None:
            budget = min(budget, self.prefill_while_decoding)
        for seq in self.running:
            if budget <= 0:
                break
            if seq.status is SeqStatus.PREFILLING and seq.prompt_remaining > 0:
                start = seq.n_past
                n = min(seq.prompt_remaining, budget, _to_next_stop(seq.prefill_stops, start))
                items.append(
                    StepItem(seq, seq.prompt[start : start + n], start, sample=start + n == len(seq.prompt))
                )
                budget -= n
        return items

    def commit(self, items: list[StepItem]) -> None:
        """The batch ran: its tokens now have KV."""
        for item in items:
            item.seq.n_past += len(item.tokens) if item.kept is None else item.kept
            if item.seq.status is SeqStatus.PREFILLING and item.seq.n_past == len(item.seq.prompt):
                item.seq.status = SeqStatus.DECODING

    def remove(self, seq: Sequence) -> None:
        """Take a finished sequence off the running list and give its slot back."""
        if seq in self.running:
            self.running.remove(seq)
        if seq.slot is not None:
            self.slots.release(seq.slot, seq.kv_tokens())

    # ------------------------------------------------------------------ views
    @property
    def n_waiting(self) -> int:
        return len(self.waiting)

    @property
    def n_running(self) -> int:
        return len(self.running)


def _to_next_stop(stops: tuple[int, ...], start: int) -> int:
    """Tokens from `start` to the first prefill stop after it (a chunk ends there), or no limit."""
    i = bisect.bisect_right(stops, start)
    return stops[i] - start if i < len(stops) else sys.maxsize
