"""LlamaRunner: the engine's model backend on llama.cpp.

Prepares a slot's KV for an admitted request, packs scheduler steps into one
llama_decode, samples with each request's own sampler chain, and releases per-request
state. Prefix reuse is delegated to a `PrefixProvider` (the cache router); without one,
only the slot's own kept KV is reused (source A), and `reuse=False` disables even that.
"""

from __future__ import annotations

import logging
from typing import Protocol

from server.engine.llama_runtime import BatchEntry, LlamaRuntime
from server.engine.sampling import SamplerChain
from server.engine.scheduler import Admission, StepItem
from server.engine.sequence import CacheReport, Sequence
from server.engine.slots import SlotPool

log = logging.getLogger(__name__)


class PrefixProvider(Protocol):
    """Makes the slot's sequence hold the longest reusable prefix of the prompt.

    Must leave the slot's sequence holding exactly prompt[:n] for the returned n (at most
    len(prompt) - 1, so the last prompt token is always computed for logits) and clear it
    on any failure (returning a report with reused_tokens=0).
    """

    def provide(self, admission: Admission) -> CacheReport: ...

    def on_finished(self, seq: Sequence, reason: str) -> None: ...

    def reclaim(self, slots: SlotPool) -> bool:
        """The KV pool is full: free some cells not used by a running request (idle slots'
        kept KV, cached prefixes). Returns False when nothing is left to give up."""


class SlotReuseOnly:
    """Source A alone: keep the slot's KV up to the common prefix, drop the rest."""

    def __init__(self, runtime: LlamaRuntime, *, reuse: bool):
        self.runtime = runtime
        self.reuse = reuse

    def provide(self, admission: Admission) -> CacheReport:
        seq, slot = admission.seq, admission.slot
        n = min(admission.common_prefix, len(seq.prompt) - 1) if self.reuse else 0
        if n <= 0 or not self.runtime.seq_rm(slot.seq_id, n, -1):
            self.runtime.seq_rm(slot.seq_id, -1, -1)
            return CacheReport()
        return CacheReport(source="A", reused_tokens=n)

    def on_finished(self, seq: Sequence, reason: str) -> None:
        pass

    def reclaim(self, slots: SlotPool) -> bool:
        return slots.drop_oldest_idle(lambda slot: self.runtime.seq_rm(slot.seq_id, -1, -1))


class LlamaRunner:
    def __init__(self, runtime: LlamaRuntime, prefix_provider: PrefixProvider):
        self.runtime = runtime
        self.prefix = prefix_provider

    def prepare(self, admission: Admission) -> None:
        seq = admission.seq
        seq.sampler = SamplerChain(seq.request.sampling, self.runtime.vocab, self.runtime.info.n_vocab)
        report = self.prefix.provide(admission)
        seq.n_past = report.reused_tokens
        seq.n_cached = report.reused_tokens
        seq.cache_report = report

    def forward(self, items: list[StepItem]) -> list[int | None]:
        entries: list[BatchEntry] = []
        for item in items:
            seq_id = item.seq.slot.seq_id
            last = len(item.tokens) - 1
            for i, tok in enumerate(item.tokens):
                entries.append(BatchEntry(tok, item.start_pos + i, seq_id, item.sample and i == last))
        logits_at = iter(self.runtime.decode(entries))
        out: list[int | None] = []
        for item in items:
            if item.sample:
                out.append(item.seq.sampler.sample(self.runtime.ctx, next(logits_at)))
            else:
                out.append(None)
        return out

    def release(self, seq: Sequence, reason: str) -> None:
        if seq.sampler is not None:
            seq.sampler.close()
            seq.sampler = None
        if seq.slot is None:
            return
        if reason == "error":
            # A failed decode or restore leaves KV we cannot vouch for: start this slot afresh.
            self.runtime.seq_rm(seq.slot.seq_id, -1, -1)
            seq.n_past = 0
        self.prefix.on_finished(seq, reason)

    def reclaim(self, slots: SlotPool) -> bool:
        return self.prefix.reclaim(slots)

    def piece(self, token: int) -> bytes:
        return self.runtime.piece(token)

    def is_eog(self, token: int) -> bool:
        return self.runtime.is_eog(token)
