"""Slots: the N sequences of the unified KV that run requests.

An idle slot keeps the KV of its last request (source A, docs/architecture.md), so the pool hands a
new request to the idle slot whose kept tokens share the longest prefix with its prompt;
ties go to the slot idle the longest, so warm prefixes of other slots survive longer.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

_CHUNK = 256


def common_prefix_len(a: Sequence[int], b: Sequence[int]) -> int:
    """Leading tokens `a` and `b` share. Compares slices (C speed) and walks token by token
    only inside the one chunk where they differ: admission compares every prompt with every
    slot, and prompts run to thousands of tokens."""
    n = min(len(a), len(b))
    if a[:n] == b[:n]:
        return n
    i = 0
    while a[i:i + _CHUNK] == b[i:i + _CHUNK]:
        i += _CHUNK
    while a[i] == b[i]:
        i += 1
    return i


_clock = itertools.count()


@dataclass
class Slot:
    index: int
    seq_id: int  # llama.cpp sequence id (from the sequence-id pool)
    # tokens whose KV this slot's sequence holds, as the cache names them (Sequence.kv_tokens: in a
    # cache namespace the first is its marker, so a prompt of another namespace shares none)
    tokens: list[int] = field(default_factory=list)
    busy: bool = False
    last_used: int = 0
    n_requests: int = 0

    def touch(self) -> None:
        self.last_used = next(_clock)


class SlotPool:
    def __init__(self, seq_ids: list[int]):
        if not seq_ids:
            raise ValueError("at least one slot is needed")
        self.slots = [Slot(index=i, seq_id=s) for i, s in enumerate(seq_ids)]

    @property
    def idle(self) -> list[Slot]:
        return [s for s in self.slots if not s.busy]

    def n_busy(self) -> int:
        return sum(1 for s in self.slots if s.busy)

    def acquire(self, prompt: list[int], *, reuse: bool) -> tuple[Slot, int] | None:
        """Take the best idle slot for `prompt`; returns (slot, common prefix length) or None.

        With reuse off every idle slot scores 0 and the least recently used one is taken.
        """
        best: tuple[int, int, Slot] | None = None
        for slot in self.idle:
            lcp = common_prefix_len(slot.tokens, prompt) if reuse else 0
            key = (lcp, -slot.last_used)
            if best is None or key > best[:2]:
                best = (lcp, -slot.last_used, slot)
        if best is None:
            return None
        slot = best[2]
        slot.busy = True
        slot.n_requests += 1
        slot.touch()
        return slot, best[0]

    def release(self, slot: Slot, kept_tokens: list[int]) -> None:
        """Mark idle, remembering which tokens its KV still holds."""
        slot.tokens = kept_tokens
        slot.busy = False
        slot.touch()

    def drop_oldest_idle(self, forget: Callable[[Slot], object]) -> bool:
        """Give up the kept KV of the idle slot unused the longest (when the KV pool is full).

        `forget(slot)` removes the slot's cells from the model's memory; afterwards the slot
        holds nothing. Returns False when no idle slot holds anything.
        """
        holding = [s for s in self.idle if s.tokens]
        if not holding:
            return False
        slot = min(holding, key=lambda s: s.last_used)
        forget(slot)
        slot.tokens = []
        return True
