"""Executing a plan (server/cache/planner.py) on llama.cpp: keep the slot's own KV (A), attach
another sequence's cells (S, seq_cp), restore a stored tier's segments (H at once; D and R read
ahead on an I/O thread while the engine decodes other requests, restored when read, as SGLang's
HiCache loads back ahead of compute).

Contracts:
- `execute(adm, best, plan, cands, lease)` commits `best` into the slot and returns the
  request's CacheReport (`loading=True` while a read ahead is pending on `lease.load`).
- While other requests compute, a restore does not run whole on the engine thread: it is staged
  where the KV allows it (`staging`: paged attention on the CPU) — joined on the join thread
  (`joiner`), its cells taken on the engine thread, its K and V written beside the decodes
  (KVOps.stage) — else restored `step_bytes` at a time between steps (`advance_loads`). The request
  waits in LOADING for its own restore only; `--cache-restore-step 0` restores whole at admission.
- In the split KV layout (`copies`: a stream per slot) S copies the other stream into the slot's
  (`copy_prefix`: whole, trimmed), and H, D and R restore from position 0 into the emptied slot:
  a state written into the slot's stream replaces it, and a copy between streams is made only
  when the next batch is computed, so neither can be joined to the slot's own KV or to a copy.
- On a model with sliding-window or recurrent layers (`states`), A resumes the slot from where
  its state allows (server/cache/checkpointed_slots.py), S shares another sequence's cells with
  a checkpoint when needed, and H, D or R restore from position 0 with the state checkpoint at
  the candidate's end (H, D: on the candidate; R: read from the store with the chunks), into
  the emptied slot.
- Any failure while attaching, reading or restoring clears the slot's sequence and falls back
  to computing the prompt, counted in `fallbacks`: a cache may make a request faster, never
  wrong.
- `requests_by_source` / `reused_tokens_by_source` count what was served, when it was
  ("none" for computing); each restore feeds the cost model's rates; a restore from H holds a
  lock reference on its path (the lease's) while it reads.
- The stored tiers are one collection (`tiers`): a candidate's tier is found by its source, a
  tier in `READ_AHEAD` gets a read thread of its own (a disk serves one read best at a time;
  a slow shared store must not hold up disk reads), the others are restored from at once.
"""

from __future__ import annotations

import logging
import time
from collections import deque
from collections.abc import Callable, Iterable
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import replace

from server.cache.checkpointed_slots import SlotStates
from server.cache.checkpoints import StateCheckpoint
from server.cache.cost import CostModel, Plan
from server.cache.disk_tier import DiskSegmentError
from server.cache.engine_time import EngineTime
from server.cache.kv_ops import ExtractError, JoinedState, KVOps, RestoreError
from server.cache.lease import CacheLease, PendingLoad
from server.cache.planner import Candidate, length_of
from server.cache.radix_tree import RadixTree
from server.cache.resident import ResidentOwners
from server.cache.restore_pieces import restore_pieces
from server.cache.shared_tier import SharedTier
from server.cache.tiers import READ_AHEAD, KVTier, Source, tier_of
from server.engine.llama_runtime import LlamaRuntime
from server.engine.scheduler import Admission
from server.engine.sequence import CacheReport, SeqStatus, Sequence

log = logging.getLogger(__name__)

READ_THREADS = {Source.D: "arbor-disk-read", Source.R: "arbor-shared-read"}  # names of the read-ahead threads


class Restorer:
    def __init__(self, *, runtime: LlamaRuntime, kv: KVOps, running: Callable[[], list[Sequence]],
                 tree: RadixTree | None, tiers: Iterable[KVTier], resident: ResidentOwners | None,
                 costs: CostModel, clock: EngineTime, states: SlotStates | None = None, copies: bool = False,
                 step_bytes: int = 0, beside: bool = True):
        """`tiers`: the stored tiers, ordered as server.cache.tiers.STORED; `copies`: the split KV layout;
        `step_bytes`: restore at most this much per engine step while other requests compute (0: whole);
        `beside`: stage such restores and write them on a thread beside the compute where `kv` can (else pieces)."""
        self.runtime, self.kv, self.running = runtime, kv, running
        self.copies = copies
        # a model with sliding-window or recurrent layers: the slots' states and checkpoints
        self.states = states
        self.tree, self.resident = tree, resident
        self.tiers: dict[Source, KVTier] = {t.source: t for t in tiers}
        # R on a model with sliding-window or recurrent layers also reads the state at a match's end
        self.shared: SharedTier | None = tier_of(self.tiers.values(), Source.R)
        self.costs, self.clock = costs, clock
        self.by_source: dict[str, int] = {**{s.value: 0 for s in Source}, "none": 0}
        self.reused_tokens: dict[str, int] = {s.value: 0 for s in Source}
        self.fallbacks = 0
        # Restores in pieces between decode steps (unified layout, full-attention models: a piece may start
        # at any position there); the longest piece's time is in the engine clock's "restore" kind.
        self.step_bytes = step_bytes if states is None and not copies else 0
        self.pieces = self.piecewise_restores = 0
        # Or staged, where the runtime can (paged attention on the CPU): the blob joined on a thread, the cells
        # taken on the engine thread, the K and V written on the runtime's write thread beside the decodes.
        self.staging = bool(self.step_bytes) and beside and kv.stages
        self.staged_restores = 0
        self.max_stage_ms = 0.0  # the longest engine-thread part of a staged restore
        # the join thread (the prefetch's staged parts join there too: server/cache/prefetch.py)
        self.joiner = ThreadPoolExecutor(max_workers=1, thread_name_prefix="arbor-kv-join") if self.staging else None
        # Reads ahead of compute: one thread per tier read ahead (see the module docstring).
        self._readers = {source: ThreadPoolExecutor(max_workers=1, thread_name_prefix=READ_THREADS[source])
                         for source in self.tiers if source in READ_AHEAD}

    def reader(self, source: Source) -> ThreadPoolExecutor | None:
        """The read thread of a tier read ahead (the prefetch reads D on it too: one read at a time)."""
        return self._readers.get(source)

    def execute(self, adm: Admission, best: Candidate | None, plan: Plan, cands: list[Candidate],
                lease: CacheLease) -> CacheReport:
        slot_seq = adm.slot.seq_id
        if best is None:
            self.runtime.seq_rm(slot_seq, -1, -1)
            if self.states is not None:  # the slot starts another path: its checkpoints are stale
                self.states.forget(adm.slot)
            self.by_source["none"] += 1
            return CacheReport(est_ms=plan.est_ms)
        try:
            if self.states is not None:
                report = self._commit_with_state(best, adm)
            else:
                report = self._commit(best, slot_seq, length_of(cands, Source.A),
                                      next((c for c in cands if c.source is Source.S), None), lease)
            if best.source in READ_AHEAD and report.source == best.source:
                self._read_ahead(lease, best, report.reused_tokens, slot_seq)
                return replace(report, loading=True, plan=plan.label, est_ms=plan.est_ms)
            if report.loading:  # restored in pieces between the next steps (advance_loads)
                return replace(report, plan=plan.label, est_ms=plan.est_ms)
        except (RestoreError, DiskSegmentError, ExtractError) as exc:
            log.warning("cache %s failed for request %d (%s); computing the prompt instead", best.source,
                        adm.seq.id, exc)
            if self.states is not None:
                self.states.forget(adm.slot)
            return self._fall_back(slot_seq, plan)
        self.by_source[best.source] += 1
        self.reused_tokens[best.source] += report.reused_tokens
        return replace(report, plan=plan.label, est_ms=plan.est_ms)

    def _fall_back(self, slot_seq: int, plan: Plan) -> CacheReport:
        self.runtime.seq_rm(slot_seq, -1, -1)
        self.fallbacks += 1
        self.by_source["none"] += 1
        return CacheReport(est_ms=plan.est_ms)

    def _commit(self, c: Candidate, slot_seq: int, a_len: int, shared: Candidate | None,
                lease: CacheLease) -> CacheReport:
        if c.source is Source.A:
            if not self.runtime.seq_rm(slot_seq, c.length, -1):
                raise RestoreError("could not trim the slot's KV")
            return CacheReport(Source.A.value, c.length)
        if c.source is Source.S:
            self._attach(c, slot_seq, c.length)
            return CacheReport(Source.S.value, c.length)
        # H, D or R: keep what the slot already holds (A), or attach the longer part another device
        # copy holds (S: the restored suffix then shares its prefix's cells instead of
        # duplicating them), and restore only the rest. Split layout: all of it, from 0.
        keep = 0 if self.copies else min(a_len, c.length)
        if self.copies:
            self.runtime.seq_rm(slot_seq, -1, -1)
        elif shared is not None and shared.src_seq is not None and min(shared.length, c.length) > keep:
            keep = min(shared.length, c.length)
            self._attach(shared, slot_seq, keep)
            if keep == c.length:  # nothing left to restore (the plan prefers S then; kept for safety)
                return CacheReport(Source.S.value, keep)
        elif not self.runtime.seq_rm(slot_seq, keep, -1):
            self.runtime.seq_rm(slot_seq, -1, -1)
            keep = 0
        if c.source in READ_AHEAD:  # read on an I/O thread; the restore follows in advance_loads
            return CacheReport(c.source.value, keep)
        if self.step_bytes and self.others_computing(slot_seq):  # in pieces, or staged
            return self._restore_later(c, keep, slot_seq, lease)
        t0 = time.perf_counter()
        result = self._restore_now(c, keep, slot_seq, lease)
        seconds = time.perf_counter() - t0
        self.costs.observe_restore(c.source.value, result.nbytes, seconds, result.n_tokens)
        return CacheReport(c.source.value, c.length, result.nbytes, seconds * 1000.0)

    def _commit_with_state(self, c: Candidate, adm: Admission) -> CacheReport:
        """The plan on a model with sliding-window or recurrent layers: A resumes the slot (cut
        back, or its checkpoint restored); S shares another slot's cells and takes its state at
        the length from a checkpoint; H and D restore [0, length) with the checkpoint at its end
        into the emptied slot (a partial state cannot be joined to the slot's own)."""
        assert self.states is not None
        if c.source is Source.A:
            if not self.states.resume(adm.slot, c.length, c.checkpoint):
                raise RestoreError("the slot's state could not be resumed")
            return CacheReport(Source.A.value, c.length)
        if c.source is Source.S:
            # another slot's or a resident owner's cells [0, length) shared, then the state there
            # from the checkpoint (a copy cut back is exact when there is none: ModelMemory.can_cut)
            assert c.src_seq is not None
            self.states.forget(adm.slot)
            slot_seq = adm.slot.seq_id
            self.runtime.seq_cp(c.src_seq, slot_seq, 0, c.length)
            if c.checkpoint is not None and not self.runtime.state_seq_set(c.checkpoint.blob, slot_seq, partial=True):
                raise RestoreError("llama.cpp refused the shared prefix's checkpoint")
            if self.runtime.seq_pos_max(slot_seq) != c.length - 1:
                raise RestoreError("attaching the shared prefix did not give the expected cells")
            if c.owner is not None:
                assert self.resident is not None  # an owner comes from the resident tier
                self.resident.note_attach(c.owner)
            return CacheReport(Source.S.value, c.length)
        shared_state = c.source is Source.R and c.match is not None and c.match.checkpoint_key is not None
        if not (c.source in (Source.H, Source.D) and c.checkpoint is not None) and not shared_state:
            raise RestoreError(f"source {c.source} cannot restore this model's state")
        self.states.forget(adm.slot)
        if c.source in READ_AHEAD:  # read on an I/O thread (R: with its checkpoint); restored in advance_loads
            return CacheReport(c.source.value, 0)
        t0 = time.perf_counter()
        result = self._restore_now(c, 0, adm.slot.seq_id, self._lease(adm))
        seconds = time.perf_counter() - t0
        self.costs.observe_restore(c.source.value, result.nbytes, seconds, result.n_tokens)
        return CacheReport(c.source.value, c.length, result.nbytes, seconds * 1000.0)

    @staticmethod
    def _lease(adm: Admission) -> CacheLease:
        assert adm.seq.cache_lease is not None  # the router puts it on before executing a plan
        return adm.seq.cache_lease

    def _attach(self, c: Candidate, slot_seq: int, length: int) -> None:
        """Give the slot positions [0, length) of the S candidate's cells. The slot's own copy is
        dropped entirely: attaching shares the other sequence's cells, so the slot's duplicates
        are freed (one physical copy of the prefix). Split layout: a copy of the other stream."""
        assert c.src_seq is not None  # an S candidate names the sequence holding the cells
        self.runtime.seq_rm(slot_seq, -1, -1)
        self.runtime.copy_prefix(c.src_seq, slot_seq, length)
        if self.runtime.seq_pos_max(slot_seq) != length - 1:
            raise RestoreError("attaching the shared prefix did not give the expected cells")
        if c.owner is not None:
            assert self.resident is not None  # an owner comes from the resident tier
            self.resident.note_attach(c.owner)

    def _restore_now(self, c: Candidate, keep: int, slot_seq: int, lease: CacheLease):
        """Restore from a tier held in memory (H), the lease holding a lock reference on the
        matched path, so no store or flush evicts it while it is read (the segments are views:
        they stay valid anyway)."""
        assert self.tree is not None  # a tier not read ahead is on the tree
        with self.tree.mutex:
            lease.lock(self.tree, c.match.tip)
        try:
            return self.kv.restore(self.tiers[c.source].load(c.match, keep), slot_seq, c.checkpoint)
        finally:
            with self.tree.mutex:
                lease.unlock(self.tree)

    def others_computing(self, slot_seq: int | None = None) -> bool:
        """Whether a request other than the one in `slot_seq` computes in the next steps (a restore then
        goes in pieces: whole, it would stall them)."""
        return any(s.slot is not None and s.slot.seq_id != slot_seq and s.status is not SeqStatus.LOADING
                   and s.status is not SeqStatus.FINISHED for s in self.running())

    def _restore_later(self, c: Candidate, keep: int, slot_seq: int, lease: CacheLease) -> CacheReport:
        """A host (H) restore made in pieces by advance_loads, the request waiting (LOADING) for its own
        only; the lease holds a lock reference on the path until it is done."""
        assert self.tree is not None  # a tier not read ahead is on the tree
        with self.tree.mutex:
            lease.lock(self.tree, c.match.tip)
        segments = self.tiers[c.source].load(c.match, keep)
        lease.kept = keep
        if self.joiner is not None:
            lease.load = PendingLoad(c, slot_seq, self.joiner.submit(self._join, segments), time.perf_counter(),
                                     phase="join")
            return CacheReport(c.source.value, keep, loading=True)
        done: Future = Future()
        done.set_result((segments, 0.0, None))
        lease.load = PendingLoad(c, slot_seq, done, time.perf_counter())
        self.piecewise_restores += 1
        return CacheReport(c.source.value, keep, loading=True)

    # -------------------------------------------------------- read ahead (D, R)
    def _read_ahead(self, lease: CacheLease, c: Candidate, keep: int, slot_seq: int) -> None:
        """Start reading the disk (or shared-store) part of a plan on an I/O thread; the slot
        already holds prompt[:keep]. `advance_loads` restores what was read."""
        tier = self.tiers[c.source]  # the candidate came from it

        def read() -> tuple[list, float, StateCheckpoint | None]:
            t0 = time.perf_counter()
            segments = tier.load(c.match, keep)
            # R on a model with sliding-window or recurrent layers: the state at the match's end
            # is in the store too (H and D carry theirs on the candidate)
            state = self.shared.load_checkpoint(c.match) if self.shared is not None and c.source is Source.R \
                and c.match.checkpoint_key is not None else None
            return segments, time.perf_counter() - t0, state

        pool = self._readers[c.source]  # made with its tier
        lease.kept = keep
        lease.load = PendingLoad(c, slot_seq, pool.submit(read), time.perf_counter())

    def _loads_done(self) -> list[Sequence]:
        """The waiting requests whose read ahead finished, in admission order."""
        return [s for s in self.running() if s.cache_lease is not None and s.cache_lease.load is not None
                and s.cache_lease.load.future.done()]

    def loads_ready(self) -> bool:
        return bool(self._loads_done())

    def advance_loads(self) -> list[tuple[Sequence, CacheReport]]:
        """Restore what the reads ahead (and the host restores made in pieces) hold, on the engine thread:
        while other requests compute at most `step_bytes` in all this step (whole pieces of tokens), else
        everything. Each request finished gets its report; a failed read or restore falls back to
        computing the prompt. A request that ended meanwhile is skipped."""
        out = []
        budget = self.step_bytes if self.step_bytes and self.others_computing() else None
        t0 = time.perf_counter()
        try:
            for seq in self._loads_done():
                lease = seq.cache_lease
                ld = lease.load
                if seq.status is SeqStatus.FINISHED:
                    lease.load = None
                    continue
                report, budget = self._advance(seq, ld, lease.plan, budget)
                if report is not None:
                    self._loaded(lease)
                    # the wait for the read is not the request's compute either (cost model)
                    lease.overhead_s += time.perf_counter() - ld.started
                    out.append((seq, report))
                if budget is not None and budget <= 0:
                    break
        finally:
            self.clock.add((time.perf_counter() - t0) * 1000.0, kind="restore")
        return out

    def _loaded(self, lease: CacheLease) -> None:
        lease.load = None
        if self.tree is not None and lease.tip is not None:  # a host restore's lock on its path
            with self.tree.mutex:
                lease.unlock(self.tree)

    def _advance(self, seq: Sequence, ld: PendingLoad, plan: Plan,
                 budget: int | None) -> tuple[CacheReport | None, int | None]:
        """The next pieces of one pending restore, or its next phase: (its report when done, else None; the budget
        left)."""
        try:
            if ld.phase == "write":  # staged, and written now
                ld.restore_s += ld.future.result()
                return self._restored(ld, plan), budget
            if ld.phase == "join":  # joined: take the cells, write them beside the compute
                joined, seconds = ld.future.result()
                ld.restore_s += seconds
                self._stage(ld, joined)
                return None, budget
            if ld.rest is None:
                segments, ld.read_s, state = ld.future.result()
                state = state or ld.cand.checkpoint
                if state is None and self.joiner is not None and self.others_computing(ld.slot_seq):
                    # read while others compute: join it on a thread, then stage it (alone: whole, below)
                    ld.future, ld.phase = self.joiner.submit(self._join, segments), "join"
                    return None, budget
                if state is not None or not self.step_bytes:  # a state restores whole, with its KV
                    t0 = time.perf_counter()
                    result = self.kv.restore(segments, ld.slot_seq, state)
                    ld.restore_s, ld.nbytes, ld.n_tokens = time.perf_counter() - t0, result.nbytes, result.n_tokens
                    return self._restored(ld, plan), budget
                ld.rest = deque(segments)
                ld.done = segments[0].pos0 if segments else 0
            r = restore_pieces(self.kv, ld.rest, ld.slot_seq, ld.done, budget)
            ld.done, ld.restore_s = r.done, ld.restore_s + r.seconds
            ld.nbytes, ld.n_tokens = ld.nbytes + r.nbytes, ld.n_tokens + r.n_tokens
            self.pieces += r.pieces
            return (self._restored(ld, plan) if not ld.rest else None), r.budget
        except Exception as exc:  # noqa: BLE001 - a cache may make a request slower, never fail it
            log.warning("cache %s failed for request %d (%s); computing the prompt instead", ld.cand.source,
                        seq.id, exc)
            return self._fall_back(ld.slot_seq, plan), budget

    def _join(self, segments: list) -> tuple[JoinedState, float]:
        """On the join thread: the segments as one state to stage, and the seconds that took."""
        t0 = time.perf_counter()
        return self.kv.joined(segments), time.perf_counter() - t0

    def _stage(self, ld: PendingLoad, joined: JoinedState) -> None:
        """Take a joined restore's cells and start its write (KVOps.stage); its request waits for its own write only."""
        st = self.kv.stage(joined, ld.slot_seq)
        self.max_stage_ms = max(self.max_stage_ms, st.stage_ms)
        ld.restore_s += st.stage_ms / 1000.0
        ld.nbytes, ld.n_tokens = st.nbytes, st.n_tokens
        ld.future, ld.phase = st.written, "write"
        self.staged_restores += 1

    def _restored(self, ld: PendingLoad, plan: Plan) -> CacheReport:
        seconds = ld.read_s + ld.restore_s
        src = ld.cand.source.value
        self.costs.observe_restore(src, ld.nbytes, seconds, ld.n_tokens)
        self.by_source[src] += 1
        self.reused_tokens[src] += ld.cand.length
        return CacheReport(src, ld.cand.length, ld.nbytes, seconds * 1000.0, plan=plan.label, est_ms=plan.est_ms)

    def close(self) -> None:
        """After the engine stopped: finish the reads ahead and the joins."""
        for pool in [*self._readers.values(), *([self.joiner] if self.joiner is not None else [])]:
            pool.shutdown(wait=True)
