"""Slot reuse (tier A) for models with sliding-window or recurrent layers: the engine's
PrefixProvider when the model needs state checkpoints (server/cache/checkpoints.py).

A slot keeps its sequence's KV after a request, as with every model; a new request sharing a
prefix of n tokens with it needs the state after exactly those n tokens. A full-attention model
gets it by cutting the KV back (`seq_rm`); this model gets it
- by cutting back too, when that is still exact (`ModelMemory.can_cut`: n is where the
  sequence ends, or, for sliding-window layers, the window's cells before n are still there);
- else from the slot's newest checkpoint at a position p <= n: the checkpoint is restored over
  the sequence's partial state, the full-attention KV cut back to p, and p tokens are reused;
- else not at all: the slot is cleared and the prompt computed. Never a wrong state: before
  this provider existed, a slot on such a model was cut back regardless and its next tokens
  attended to a window with cells missing.

Checkpoints are taken where llama-server takes its context checkpoints, during prefill (a chunk
ends at each of `checkpoints.stops`: every `every` tokens, and before the prompt's last token),
and belong to the slot: they are forgotten past a cut and cleared with the slot.

Contracts (engine thread): `provide` leaves the slot holding exactly prompt[:n] for the n it
reports (0: cleared); `checkpoint(seq, pos)` is called after the chunk ending at a stop ran;
`stats()` counts reuse by how it was obtained.
"""

from __future__ import annotations

import logging

from server.cache.checkpoints import ModelMemory, SlotCheckpoints, StateCheckpoint, stops
from server.engine.llama_runtime import LlamaRuntime
from server.engine.scheduler import Admission
from server.engine.sequence import CacheReport, Sequence
from server.engine.slots import Slot, SlotPool

log = logging.getLogger(__name__)


class CheckpointedSlotReuse:
    def __init__(self, runtime: LlamaRuntime, memory: ModelMemory, *, reuse: bool, per_slot: int, every: int):
        self.runtime, self.memory = runtime, memory
        self.reuse, self.per_slot, self.every = reuse, per_slot, every
        self._slots: dict[int, SlotCheckpoints] = {}  # slot index -> its checkpoints
        self.reused_by_cut = 0  # requests that reused a prefix by cutting the slot back
        self.reused_by_checkpoint = 0  # ... by restoring one of its checkpoints
        self.recomputed = 0  # shared a prefix with the slot, but no state for it: computed
        self.checkpoints_taken = 0
        self.checkpoint_errors = 0

    def _of(self, slot: Slot) -> SlotCheckpoints:
        found = self._slots.get(slot.index)
        if found is None:
            found = self._slots[slot.index] = SlotCheckpoints(self.per_slot)
        return found

    # ------------------------------------------------------------- admission
    def provide(self, admission: Admission) -> CacheReport:
        seq, slot = admission.seq, admission.slot
        n = self._reuse(seq, slot, min(admission.common_prefix, len(seq.prompt) - 1) if self.reuse else 0)
        if self.per_slot > 0:
            seq.prefill_stops = stops(len(seq.prompt), n, self.every)
        return CacheReport(source="A", reused_tokens=n) if n > 0 else CacheReport()

    def _reuse(self, seq: Sequence, slot: Slot, n: int) -> int:
        """Leave the slot holding the longest resumable prompt[:k], k <= n; return k."""
        sid, ckpts = slot.seq_id, self._of(slot)
        if n > 0 and self.memory.can_cut(self.runtime, sid, n, len(slot.tokens)) and self.runtime.seq_rm(sid, n, -1):
            ckpts.forget_after(n)
            self.reused_by_cut += 1
            return n
        ckpt = ckpts.newest_at_or_below(n) if n > 0 else None
        if ckpt is not None:
            # the partial state first (llama.cpp replaces the sequence's SWA cells or recurrent
            # state with it), then the full-attention KV cut back to the same position
            if self.runtime.state_seq_set(ckpt.blob, sid, partial=True) and self.runtime.seq_rm(sid, ckpt.pos, -1):
                ckpts.forget_after(ckpt.pos)
                self.reused_by_checkpoint += 1
                return ckpt.pos
            log.warning("slot %d: restoring its checkpoint at %d failed; computing the prompt", slot.index, ckpt.pos)
            self.checkpoint_errors += 1
        if n > 0:
            self.recomputed += 1
        self.runtime.seq_rm(sid, -1, -1)
        ckpts.clear()
        return 0

    def checkpoint(self, seq: Sequence, pos: int) -> None:
        if seq.slot is None:
            return
        try:
            blob = bytes(self.runtime.state_seq_get(seq.slot.seq_id, partial=True))
        except Exception as exc:  # noqa: BLE001 - a missing checkpoint costs compute later, never a request
            log.warning("request %d: checkpoint at %d failed: %s", seq.id, pos, exc)
            self.checkpoint_errors += 1
            return
        self._of(seq.slot).add(StateCheckpoint(pos, blob))
        self.checkpoints_taken += 1

    # --------------------------------------------------------------- the rest
    def on_finished(self, seq: Sequence, reason: str) -> None:
        if seq.slot is not None and reason == "error":  # the runner cleared the slot's KV
            self._of(seq.slot).clear()

    def reclaim(self, slots: SlotPool) -> bool:
        def drop(slot: Slot) -> None:
            self.runtime.seq_rm(slot.seq_id, -1, -1)
            self._of(slot).clear()

        return slots.drop_oldest_idle(drop)

    def background(self, idle: bool) -> None:
        pass

    def advance_loads(self) -> list[tuple[Sequence, CacheReport]]:
        return []

    def loads_ready(self) -> bool:
        return False

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
        }
