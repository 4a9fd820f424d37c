"""Slots on models with sliding-window or recurrent layers (server/cache/checkpoints.py): how far
a slot can go back, its checkpoints, and tier A alone as the engine's PrefixProvider.

A slot keeps its sequence's KV after a request, as with every model; a new request sharing a
prefix of n tokens with it needs the state after exactly those n tokens. A full-attention model
gets it by cutting the KV back (`seq_rm`); these models get it
- by cutting back too, when that is still exact (`ModelMemory.can_cut`: n is where the
  sequence ends, or, for sliding-window layers, the window's cells before n are still there);
- else from the newest checkpoint at a position p <= n, the slot's own or one kept in host RAM
  for the same tokens (server/cache/checkpoint_store.py): it is restored over the sequence's
  partial state, the full-attention KV cut back to p, and p tokens are reused;
- else not at all: the slot is cleared and the prompt computed, never resumed from a state it
  does not have.

Checkpoints are taken during prefill, where llama-server takes its context checkpoints (a chunk
ends at each of `checkpoints.stops`: every `every` tokens, and before the prompt's last token)
and at branch points (where the prompt leaves a path the cache knows: the slot's, another
slot's, the tree's; the next prompt of the same family, e.g. under the same system prompt, will
resume there), and belong to the slot: forgotten past a cut, cleared with the slot, handed to the host store
(with one more at the slot's end) when the slot's KV is written back to H/D (`hand_over`).

Contracts (engine thread): `SlotStates.resumable` says (k, checkpoint or None) and changes
nothing; `resume` applies it (False, the slot cleared, if llama.cpp refused); `CheckpointedSlotReuse`
(tier A alone: the provider when tiers S/H/D are off) leaves the slot holding exactly
prompt[:n] for the n it reports.
"""

from __future__ import annotations

import logging

from server.cache.checkpoint_store import CheckpointStore
from server.cache.checkpoints import ModelMemory, SlotCheckpoints, StateCheckpoint, stops, turn_starts
from server.cache.tiers import Source
from server.engine.llama_runtime import LlamaRuntime
from server.engine.scheduler import Admission
from server.engine.sequence import CacheReport, Sequence
from server.engine.slots import Slot, SlotPool

log = logging.getLogger(__name__)

# Tokens below which two checkpoints of one path are one too many in the host store: the state
# before a prompt's last token and the one at the end of a short reply, say. Recomputing up to
# 63 tokens costs less than keeping another window (2.4 MB on the Gemma 3 bench model).
MIN_GAP = 64


class SlotStates:
    def __init__(self, runtime: LlamaRuntime, memory: ModelMemory, *, per_slot: int, every: int,
                 store: CheckpointStore | None = None, align: int = 0):
        """`align` (the shared store's chunk, 0 without one): a turn start also gets a stop at
        the multiple of `align` at or below it, a checkpoint the shared store can key."""
        self.runtime, self.memory = runtime, memory
        self.per_slot, self.every, self.store, self.align = per_slot, every, store, align
        self._slots: dict[int, SlotCheckpoints] = {}  # slot index -> its checkpoints
        self.reused_by_cut = 0  # slot reuse by cutting back
        self.reused_by_checkpoint = 0  # ... by restoring a checkpoint
        self.recomputed = 0  # shared a prefix with the slot, but no state for it
        self.checkpoints_taken = 0
        self.checkpoint_errors = 0

    def of(self, slot: Slot) -> SlotCheckpoints:
        found = self._slots.get(slot.index)
        if found is None:
            found = self._slots[slot.index] = SlotCheckpoints(self.per_slot)
        return found

    def resumable(self, slot: Slot, prompt: list[int], n: int,
                  held: int | None = None) -> tuple[int, StateCheckpoint | None]:
        """The longest k <= n for which the state after prompt[:k] can be had from the slot's
        sequence (which holds prompt[:n] at least, of its `held` tokens: by default its kept
        ones), and the checkpoint that takes (None: a cut, or a copy cut back, is enough).
        Changes nothing. Also what another slot can take from this one (tier S)."""
        if n <= 0:
            return 0, None
        if self.memory.can_cut(self.runtime, slot.seq_id, n, len(slot.tokens) if held is None else held):
            return n, None
        own = self.of(slot).newest_at_or_below(n)
        kept = self.store.best(prompt, n) if self.store is not None else None  # same tokens, any slot
        best = max((c for c in (own, kept) if c is not None), key=lambda c: c.pos, default=None)
        return (best.pos, best) if best is not None else (0, None)

    def resume(self, slot: Slot, k: int, ckpt: StateCheckpoint | None) -> bool:
        """Leave the slot holding its first k tokens' state: cut back, after restoring `ckpt` over
        its partial state when given. False (the slot cleared) when llama.cpp refused."""
        sid = slot.seq_id
        # the partial state first (llama.cpp replaces the sequence's window cells or recurrent
        # state with it), then the full-attention KV cut back to the same position
        ok = k > 0 and (ckpt is None or self.runtime.state_seq_set(ckpt.blob, sid, partial=True))
        if ok and self.runtime.seq_rm(sid, k, -1):
            self.of(slot).forget_after(k)
            if ckpt is None:
                self.reused_by_cut += 1
            else:
                self.reused_by_checkpoint += 1
            return True
        if ckpt is not None:
            log.warning("slot %d: restoring a checkpoint at %d failed; computing the prompt", slot.index, k)
            self.checkpoint_errors += 1
        self.forget(slot)
        return False

    def forget(self, slot: Slot) -> None:
        """The slot's sequence was cleared (or now holds another path): its checkpoints go."""
        self.runtime.seq_rm(slot.seq_id, -1, -1)
        self.of(slot).clear()

    def set_stops(self, seq: Sequence, reused: int) -> None:
        """The request's prefill stops: every `every` tokens, before its last token, and where its
        turns begin (after `reused`)."""
        if self.per_slot > 0:
            turns = [p for p in turn_starts(seq.prompt, self.runtime.is_control) if reused < p < len(seq.prompt) - 1]
            aligned = [p - p % self.align for p in turns if p - p % self.align > reused] if self.align else []
            seq.prefill_stops = tuple(sorted({*stops(len(seq.prompt), reused, self.every), *turns, *aligned}))

    def add_stop(self, seq: Sequence, pos: int) -> None:
        """`seq`'s prefill also stops at `pos` (a branch point, or where a waiting request will take
        over from it), so the state there is checkpointed."""
        if self.per_slot > 0 and seq.n_past < pos < len(seq.prompt) and pos not in seq.prefill_stops:
            seq.prefill_stops = tuple(sorted((*seq.prefill_stops, pos)))

    def capture(self, seq: Sequence, pos: int) -> None:
        """A prefill chunk ended at `pos` (one of the request's stops): checkpoint the slot there."""
        if seq.slot is None:
            return
        ckpt = self._take(seq.slot.seq_id, pos, seq.id)
        if ckpt is not None:
            self.of(seq.slot).add(ckpt)

    def hand_over(self, slot: Slot) -> None:
        """The slot's KV is being written back to host/disk (its device copy is about to go): its
        checkpoints, and one at its end (the state it holds now), go to the host store, except
        one less than MIN_GAP tokens past another: the shallower serves both prefixes, the
        deeper one's few tokens computed again (a window's cells cost far more to keep)."""
        if self.store is None or not slot.tokens:
            return
        tokens = list(slot.tokens)
        kept = -MIN_GAP
        for ckpt in sorted(self.of(slot).all(), key=lambda c: c.pos):
            if ckpt.pos <= len(tokens) and ckpt.pos - kept >= MIN_GAP:
                self.store.put(tokens, ckpt)
                kept = ckpt.pos
        if len(tokens) - kept >= MIN_GAP:
            self.hand_over_sequence(slot.seq_id, tokens)

    def hand_over_sequence(self, seq_id: int, tokens: list[int]) -> None:
        """A sequence that holds exactly `tokens` (a resident owner) is being written back to
        host/disk: its state at its end goes to the host store."""
        if self.store is not None and tokens:
            end = self._take(seq_id, len(tokens), None)
            if end is not None:
                self.store.put(tokens, end)

    def _take(self, seq_id: int, pos: int, request: int | None) -> StateCheckpoint | None:
        try:
            blob = bytes(self.runtime.state_seq_get(seq_id, partial=True))
        except Exception as exc:  # noqa: BLE001 - a missing checkpoint costs compute later, never a request
            log.warning("request %s: a checkpoint at %d failed: %s", request, pos, exc)
            self.checkpoint_errors += 1
            return None
        self.checkpoints_taken += 1
        return StateCheckpoint(pos, blob)

    def stats(self) -> dict:
        held = list(self._slots.values())
        return {
            "memory": self.memory.describe(),
            "reused_by_cut": self.reused_by_cut,
            "reused_by_checkpoint": self.reused_by_checkpoint,
            "recomputed": self.recomputed,
            "checkpoints": {"taken": self.checkpoints_taken, "errors": self.checkpoint_errors,
                            "held": sum(len(c) for c in held), "bytes": sum(c.nbytes for c in held),
                            "per_slot": self.per_slot, "every": self.every},
            **({"host_checkpoints": self.store.stats()} if self.store is not None else {}),
        }


class CheckpointedSlotReuse:
    """Tier A alone on a model that needs checkpoints: the PrefixProvider when S/H/D are off."""

    def __init__(self, runtime: LlamaRuntime, memory: ModelMemory, *, reuse: bool, per_slot: int, every: int):
        self.reuse = reuse
        self.states = SlotStates(runtime, memory, per_slot=per_slot, every=every)

    def provide(self, admission: Admission) -> CacheReport:
        seq, slot = admission.seq, admission.slot
        n = min(admission.common_prefix, len(seq.prompt) - 1) if self.reuse else 0
        k, ckpt = self.states.resumable(slot, seq.cache_prompt, n)
        if k == 0 or not self.states.resume(slot, k, ckpt):
            if n > 0:
                self.states.recomputed += 1
            self.states.forget(slot)
            k = 0
        if self.reuse:
            self.states.set_stops(seq, k)
            if n > k:  # where it leaves the slot's old path: a branch point
                self.states.add_stop(seq, n)
        return CacheReport(source=Source.A.value, reused_tokens=k) if k > 0 else CacheReport()

    def checkpoint(self, seq: Sequence, pos: int) -> None:
        self.states.capture(seq, pos)

    def on_finished(self, seq: Sequence, reason: str) -> None:
        if seq.slot is not None and reason == "error":  # the runner cleared the slot's KV
            self.states.of(seq.slot).clear()

    def reclaim(self, slots: SlotPool) -> bool:
        return slots.drop_oldest_idle(self.states.forget)

    def background(self, idle: bool) -> None:
        pass

    def idle_work(self) -> float | None:
        return None

    def advance_loads(self) -> list[tuple[Sequence, CacheReport]]:
        return []

    def loads_ready(self) -> bool:
        return False

    def stats(self) -> dict:
        return self.states.stats()
