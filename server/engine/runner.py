"""LlamaRunner: the engine's model backend on llama.cpp.

Prepares a slot's KV for an admitted request, packs scheduler steps into one
llama_decode, samples with each request's own sampler chain, and releases per-request
state. Prefix reuse is delegated to a `PrefixProvider` (the cache router); without one,
only the slot's own kept KV is reused (source A), and `reuse=False` disables even that.
"""

from __future__ import annotations

import logging
from typing import Protocol

from server.engine.llama_runtime import LlamaRuntime
from server.engine.logprobs import token_logprob
from server.engine.sampling import SamplerChain
from server.engine.scheduler import Admission, StepItem
from server.engine.sequence import NO_TOKEN, CacheReport, SeqStatus, Sequence
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

    def background(self, idle: bool) -> None:
        """Once per engine step, after the decode: bounded cache work (all of it when `idle`)."""

    def advance_loads(self) -> list[tuple[Sequence, CacheReport]]:
        """Finish the preparations whose read ahead is done (restore what was read, or fall
        back to computing): each sequence with its final report. Engine thread."""

    def loads_ready(self) -> bool:
        """A read ahead has finished and waits for advance_loads (any thread)."""

    def checkpoint(self, seq: Sequence, pos: int) -> None:
        """The slot's sequence holds exactly seq.kv_tokens()[:pos], a prefill chunk having just
        ended at one of `seq.prefill_stops`: keep what is needed to resume from there later
        (providers that set no stops never get this call). Engine thread, after the decode."""


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

    def background(self, idle: bool) -> None:
        pass

    def advance_loads(self) -> list[tuple[Sequence, CacheReport]]:
        return []

    def loads_ready(self) -> bool:
        return False

    def checkpoint(self, seq: Sequence, pos: int) -> None:
        pass


class LlamaRunner:
    def __init__(self, runtime: LlamaRuntime, prefix_provider: PrefixProvider):
        self.runtime = runtime
        self.prefix = prefix_provider

    def prepare(self, admission: Admission) -> None:
        seq = admission.seq
        seq.sampler = SamplerChain(seq.request.sampling, self.runtime.vocab, self.runtime.info.n_vocab)
        self._apply(seq, self.prefix.provide(admission))

    @staticmethod
    def _apply(seq: Sequence, report: CacheReport) -> None:
        seq.n_past = report.reused_tokens
        seq.n_cached = report.reused_tokens
        seq.cache_report = report
        seq.status = SeqStatus.LOADING if report.loading else SeqStatus.PREFILLING

    def advance_loads(self) -> None:
        """Sequences whose prefix was read ahead become ready to prefill (or to compute it all)."""
        for seq, report in self.prefix.advance_loads():
            if seq.status is SeqStatus.LOADING:
                self._apply(seq, report)

    def loads_ready(self) -> bool:
        return self.prefix.loads_ready()

    def forward(self, items: list[StepItem]) -> list[int | None]:
        tokens: list[int] = []
        positions: list[int] = []
        seq_ids: list[int] = []
        logits: list[int] = []
        for item in items:
            n = len(item.tokens)
            tokens += item.tokens
            positions += range(item.start_pos, item.start_pos + n)
            seq_ids += [item.seq.slot.seq_id] * n
            if n > 1:
                logits += [0] * (n - 1)
            logits.append(1 if item.sample else 0)
        batch_index = self.runtime.decode_arrays(tokens, positions, seq_ids, logits)
        for item in items:  # a prompt chunk that ended at a stop: the state there is checkpointed
            if item.seq.prefill_stops and item.start_pos + len(item.tokens) in item.seq.prefill_stops:
                self.prefix.checkpoint(item.seq, item.start_pos + len(item.tokens))
        sampling = [item for item in items if item.sample]
        greedy_rows = [row for row, item in enumerate(sampling) if item.seq.sampler.plain_greedy]
        picked: dict[int, int] = {}
        if greedy_rows:
            matrix = self.runtime.logits_matrix(len(sampling))
            best = matrix.argmax(axis=1) if len(greedy_rows) == len(sampling) else matrix[greedy_rows].argmax(axis=1)
            picked = dict(zip(greedy_rows, best.tolist()))
        out: list[int | None] = []
        row = 0
        for item in items:
            if not item.sample:
                out.append(None)
                continue
            token = picked.get(row)
            if token is None:
                token = item.seq.sampler.sample(self.runtime.ctx, batch_index[row])
                if token is None:
                    log.warning("request %d: its grammar allows no token from here (a dead end); stopping it",
                                item.seq.id)
                    token = NO_TOKEN
            out.append(token)
            k = item.seq.request.logprobs
            if k is not None and token != NO_TOKEN:  # read before the next decode overwrites the logits
                item.seq.next_logprob = token_logprob(self.runtime.logits_matrix(len(sampling))[row], token, k)
            row += 1
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
        freed = self.prefix.reclaim(slots)
        if freed:
            # a full cache put tokens among other sequences' cells; the freed pages can take them back
            self.runtime.defragment_pages()
        return freed

    def background(self, idle: bool) -> None:
        self.prefix.background(idle)
        if idle:
            self.runtime.defragment_pages()

    def piece(self, token: int, *, special: bool = False) -> bytes:
        return self.runtime.piece(token, special=special)

    def is_eog(self, token: int) -> bool:
        return self.runtime.is_eog(token)
