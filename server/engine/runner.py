"""LlamaRunner: the engine's model backend on llama.cpp.

Prepares a slot's KV for an admitted request, packs scheduler steps into one
llama_decode, samples with each request's own sampler chain, and releases per-request
state. Prefix reuse is delegated to a `PrefixProvider` (the cache router); without one,
only the slot's own kept KV is reused (source A), and `reuse=False` disables even that.
With a `Speculator` (server/engine/speculative/), decoding sequences may carry drafts, which
`forward` verifies: a drafted token stands while it equals what the sequence's own sampler
picks at its row, so the output is what the target alone would give.
"""

from __future__ import annotations

import logging
import time
from typing import Protocol

from server.engine.kv_full import KVCacheFull
from server.engine.llama_runtime import LlamaRuntime
from server.engine.logprobs import token_logprob
from server.engine.sampling import SamplerChain
from server.engine.scheduler import Admission, StepItem
from server.engine.sequence import NO_TOKEN, CacheReport, SeqStatus, Sequence
from server.engine.slots import SlotPool
from server.engine.speculative.speculator import Speculator

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

    def idle_work(self) -> float | None:
        """Nothing to compute: cache work ahead of requests (a prefetch); seconds until it wants to run
        again, None: not before new work (ModelRunner.idle_work)."""

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

    def idle_work(self) -> float | None:
        return None

    def advance_loads(self) -> list[tuple[Sequence, CacheReport]]:
        return []

    def loads_ready(self) -> bool:
        return False

    def checkpoint(self, seq: Sequence, pos: int) -> None:
        pass


class LlamaRunner:
    def __init__(self, runtime: LlamaRuntime, prefix_provider: PrefixProvider, speculator: Speculator | None = None):
        self.runtime = runtime
        self.prefix = prefix_provider
        self.speculator = speculator

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

    def forward(self, items: list[StepItem]) -> list[list[int] | None]:
        if self.runtime.split and len(items) > 1:
            # Split KV layout: llama.cpp cuts a batch into ubatches of consecutive, increasing sequence ids with
            # as many tokens each (split_equal), so the step's rows go in slot order, as llama-server's do: one
            # forward pass for every sequence's decode token, not one per sequence out of order.
            order = sorted(range(len(items)), key=lambda i: items[i].seq.slot.seq_id)
            if order != list(range(len(items))):
                ordered = self._forward([items[i] for i in order])
                out: list[list[int] | None] = [None] * len(items)
                for k, i in enumerate(order):
                    out[i] = ordered[k]
                return out
        return self._forward(items)

    def _forward(self, items: list[StepItem]) -> list[list[int] | None]:
        t0 = time.perf_counter()
        if self.speculator is not None:
            self.speculator.propose(items, self.runtime.n_batch - sum(len(i.tokens) for i in items))
        arrays = self._arrays(items)
        try:
            batch_index = self.runtime.decode_arrays(*arrays)
        except KVCacheFull:
            if not any(item.draft for item in items):
                raise
            # nothing was computed: the step runs without its drafts before any cell is given up for them
            self._drop_drafts(items)
            arrays = self._arrays(items)
            batch_index = self.runtime.decode_arrays(*arrays)
        tokens = arrays[0]
        for item in items:  # a prompt chunk that ended at a stop: the state there is checkpointed
            if item.seq.prefill_stops and item.start_pos + len(item.tokens) in item.seq.prefill_stops:
                self.prefix.checkpoint(item.seq, item.start_pos + len(item.tokens))
        sampling = [item for item in items if item.sample]
        n_rows = len(batch_index)
        first_row: list[int] = []  # each sampling item's first output row
        row = 0
        for item in sampling:
            first_row.append(row)
            row += 1 + len(item.draft)
        greedy = [i for i, item in enumerate(sampling) if item.seq.sampler.plain_greedy]
        best: dict[int, int] = {}  # output row -> its argmax, for the plain greedy items' rows
        if greedy:
            matrix = self.runtime.logits_matrix(n_rows)
            rows = [r for i in greedy for r in range(first_row[i], first_row[i] + 1 + len(sampling[i].draft))]
            picked = matrix.argmax(axis=1) if len(rows) == n_rows else matrix[rows].argmax(axis=1)
            best = dict(zip(rows, picked.tolist()))
        out: list[list[int] | None] = []
        i = 0
        for item in items:
            if not item.sample:
                out.append(None)
                continue
            out.append(self._verify(item, first_row[i], batch_index, best, n_rows))
            i += 1
        if self.speculator is not None and all(item.sample and len(item.tokens) == 1 + len(item.draft)
                                               for item in items):  # decode steps only (see policy.py)
            self.speculator.observe_step(len(tokens), time.perf_counter() - t0)
        return out

    def _verify(self, item: StepItem, row0: int, batch_index: list[int], best: dict[int, int],
                n_rows: int) -> list[int]:
        """The tokens `item`'s sampler picks at its rows, in order, while they equal its draft (llama.cpp's rule:
        greedy, the argmax; sampled, the chain's own draw, so the output keeps the target's distribution); the
        first that differs (or follows the whole draft) ends it. Rejected drafted tokens leave the KV."""
        seq, draft = item.seq, item.draft
        k = seq.request.logprobs
        picked: list[int] = []
        for j in range(len(draft) + 1):
            row = row0 + j
            token = best.get(row)
            if token is None:
                token = seq.sampler.sample(self.runtime.ctx, batch_index[row])
                if token is None:
                    log.warning("request %d: its grammar allows no token from here (a dead end); stopping it", seq.id)
                    picked.append(NO_TOKEN)
                    break
            picked.append(token)
            if k is not None:  # read before the next decode overwrites the logits
                seq.next_logprobs.append(token_logprob(self.runtime.logits_matrix(n_rows)[row], token, k))
            if j == len(draft) or token != draft[j]:
                break
        n_accepted = len(picked) - 1  # every token before the last equalled the draft (a dead end included)
        if draft:
            item.kept = 1 + n_accepted
            if n_accepted < len(draft):
                self.runtime.seq_rm(seq.slot.seq_id, item.start_pos + item.kept, -1)
        if self.speculator is not None:
            self.speculator.settle(item, n_accepted)
        return picked

    @staticmethod
    def _arrays(items: list[StepItem]) -> tuple[list[int], list[int], list[int], list[int]]:
        """The batch of `items`: tokens, positions, sequence ids, and which rows give logits (the last row of an
        item that samples; every row of an item with a draft to verify)."""
        tokens: list[int] = []
        positions: list[int] = []
        seq_ids: list[int] = []
        logits: list[int] = []
        for item in items:
            n = len(item.tokens)
            tokens += item.tokens
            positions += range(item.start_pos, item.start_pos + n)
            seq_ids += [item.seq.slot.seq_id] * n
            if item.draft:
                logits += [1] * n
                continue
            if n > 1:
                logits += [0] * (n - 1)
            logits.append(1 if item.sample else 0)
        return tokens, positions, seq_ids, logits

    @staticmethod
    def _drop_drafts(items: list[StepItem]) -> None:
        for item in items:
            if item.draft:
                item.tokens = item.tokens[:1]
                item.draft = []

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
        elif seq.n_drafted:
            # a verified draft may have run past where the request stopped (the engine cut n_past back)
            self.runtime.seq_rm(seq.slot.seq_id, seq.n_past, -1)
        if self.speculator is not None:
            self.speculator.release(seq)
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

    def idle_work(self) -> float | None:
        return self.prefix.idle_work()

    def piece(self, token: int, *, special: bool = False) -> bytes:
        return self.runtime.piece(token, special=special)

    def is_eog(self, token: int) -> bool:
        return self.runtime.is_eog(token)
