"""The prefix router: for each admitted request, the longest executable prefix among

- A: the slot's own kept KV,
- S: KV already in the unified cache under another sequence: a resident owner, or another
     slot (idle or running) whose computed tokens share the prefix; attached with seq_cp,
- H: segments in host RAM, restored,
- D: segment files on disk, restored,
- R: chunks in a store shared by replicas (Redis/Valkey, server/cache/shared_tier.py),
     asked at admission, read ahead like D, restored,

one plan committed per request: with route `cost` (the default) the plan with the lowest
estimated time to first token from rates measured online (server/cache/cost.py), with
route `longest` the longest match; ties A > S > H > D > R. Any failure while
attaching or restoring clears the slot's sequence and falls back to computing the prompt:
a cache may make a request faster, never wrong. After a request completes (never before),
its common prefix may be published as resident. Copies to host (and disk) are made
write-back: only when a device copy is about to be lost (a slot taken for another prefix,
a resident owner evicted, an idle slot's KV dropped for room), increments only, and not
when another slot or owner still holds the same tokens. A slot taken for another prefix is
parked rather than stored at once, and stored a bounded piece per engine step
(server/cache/write_back.py), so no decode step waits for a whole store. Requests that arrive while another one is still computing a long common prefix
wait for it and then attach (in-flight sharing), instead of computing it twice.

Resident owners, H and D are recorded on the nodes of one radix tree (server/cache/
radix_tree.py), so one walk of it says how far a prompt is held in each. Slots stay
per-slot token lists (`_best_live`): a running slot's tokens change at every decode step,
so indexing them would cost a tree update per token, while scanning the few slots costs
one prefix comparison each per admission.
"""

from __future__ import annotations

import logging
import time
from collections import deque
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, replace

from server.cache.cost import CostModel, Plan, PlanOption
from server.cache.disk_tier import DiskMatch, DiskSegmentError, DiskTier
from server.cache.host_tier import HostTier
from server.cache.kv_ops import ExtractError, KVOps, RestoreError
from server.cache.lease import CacheLease, PendingLoad
from server.cache.lifecycle import SessionRegistry
from server.cache.radix_tree import RadixTree
from server.cache.resident import ResidentOwners
from server.cache.shared_tier import SharedTier
from server.cache.tiers import READ_AHEAD, STORED, KVTier, Source
from server.cache.write_back import WriteBackQueue
from server.engine.llama_runtime import LlamaRuntime
from server.engine.scheduler import Admission
from server.engine.sequence import CacheReport, Sequence, SeqStatus
from server.engine.slots import SlotPool, common_prefix_len

log = logging.getLogger(__name__)
ROUTES = ("cost", "longest")


@dataclass(frozen=True)
class Candidate:
    source: Source
    length: int
    src_seq: int | None = None  # S: the sequence holding the cells
    owner: object | None = None  # S: the resident owner, when it is one
    match: object | None = None  # H, D, R: the tier's lookup, what its load reads


class CacheRouter:
    def __init__(self, *, runtime: LlamaRuntime, kv: KVOps, slots: SlotPool, running: Callable[[], list[Sequence]],
                 tiers: set[str], tree: RadixTree | None, host: HostTier | None, disk: DiskTier | None,
                 resident_cells: int | None, registry: SessionRegistry, min_tokens: int, route: str = "cost",
                 write_back_step_bytes: int = 0, idle_cells: int | None = None, shared: SharedTier | None = None):
        if route not in ROUTES:
            raise ValueError(f"unknown cache route {route!r}; choose among {', '.join(ROUTES)}")
        self.runtime = runtime
        self.kv = kv
        self.slots = slots
        self.running = running
        self.tiers = tiers
        self.tree = tree  # the one tree indexing the resident owners, H and D
        self.host = host
        self.disk = disk
        self.shared = shared  # tier R: not on the tree (the store changes under every replica)
        # Resident owners (tier S, when `resident_cells` is given) write back through this router.
        self.resident = (ResidentOwners(tree, runtime, kv.seq_ids, resident_cells, registry,
                                        on_evict=self._write_back_owner) if resident_cells is not None else None)
        self.registry = registry
        self._pin_signature: tuple | None = None  # what the pinned-bytes quota last looked at
        self.min_tokens = min_tokens
        self.route = route
        self.costs = CostModel()
        self.by_plan: dict[str, int] = {**{s.value: 0 for s in Source}, "compute": 0}
        self.shorter_than_longest = 0  # plans that left a longer match unused because it cost more
        self.recent_plans: deque[dict] = deque(maxlen=16)
        # slot index -> the cache hint of its last request: the slot's kept KV (tier A) outlives
        # the request and its lease, and is written back later under that hint
        self._slot_hints: dict[int, object] = {}
        self.write_backs = 0
        self.idle_cells = idle_cells  # cells idle slots may keep while requests run (None: no limit)
        self.idle_offloads = 0  # idle slots written back and freed for that limit
        self.engine_ms = 0.0  # engine-thread time spent in the cache (routing, restores, write-back)
        self.write_back_ms = 0.0
        # Parking needs the host tier (a stored path grows piece by piece there) and parked ids.
        self.parked = (WriteBackQueue(runtime, kv.seq_ids, self._store, lambda: host.bytes_per_token,
                                      write_back_step_bytes)
                       if host is not None and write_back_step_bytes > 0 and kv.seq_ids.layout.parked else None)
        # The longest stretch of cache work between two decodes (other streams wait for it): one
        # admission (routing, restore, a write-back in one go) or one step's write-back pieces.
        self.max_step_cache_ms = 0.0
        self.by_source: dict[str, int] = {**{s.value: 0 for s in Source}, "none": 0}
        self.reused_tokens: dict[str, int] = {s.value: 0 for s in Source}
        self.fallbacks = 0
        self.deferrals = 0  # requests deferred at least once (not deferral decisions)
        self.store_errors = 0
        # Disk reads run here, ahead of compute: one thread, as a disk serves one read best at a time.
        self._io = ThreadPoolExecutor(max_workers=1, thread_name_prefix="arbor-disk-read") if disk else None
        # Shared-store reads get their own thread: a slow store must not hold up disk reads.
        self._net = ThreadPoolExecutor(max_workers=1, thread_name_prefix="arbor-shared-read") if shared else None

    @staticmethod
    def lease(seq: Sequence) -> CacheLease:
        """The request's cache lease (server/cache/lease.py), put on it at first sight."""
        if seq.cache_lease is None:
            seq.cache_lease = CacheLease(hint=seq.request.cache_hint)
        return seq.cache_lease

    # -------------------------------------------------------------- choosing
    def candidates(self, adm: Admission) -> list[Candidate]:
        prompt = adm.seq.prompt
        limit = len(prompt) - 1  # the last prompt token is always computed, for its logits
        out: list[Candidate] = []
        if Source.A in self.tiers:
            out.append(Candidate(Source.A, min(adm.common_prefix, limit)))
        rn, rowner, stored = 0, None, []
        if self.parked is not None and Source.S not in self.tiers:
            self.parked.finish_matching(prompt[:limit], self.min_tokens)  # H must hold what it needs
        if self.tree is not None:
            with self.tree.mutex:  # one walk for the resident owners, H and D
                m = self.tree.match_prefix(prompt[:limit])
                if self.resident is not None:
                    rn, rowner = self.resident.take(m)
                for tier in (self.host, self.disk):
                    if tier is not None:
                        found = tier.lookup(prompt[:limit], m)
                        stored.append(Candidate(tier.source, found.length, match=found))
        if Source.S in self.tiers:
            n, src, owner = self._best_live(adm)
            if rn > n:
                n, src, owner = rn, rowner.seq_id, rowner
            out.append(Candidate(Source.S, min(n, limit), src_seq=src, owner=owner))
        out += stored
        if self.shared is not None:
            # Asked only when it could beat every local source by a whole chunk: a lookup is a
            # network round trip on this (the engine) thread, bounded by the tier's timeout.
            local = max((c.length for c in out), default=0)
            if limit - local >= self.shared.chunk:
                sm = self.shared.lookup(prompt[:limit])
                if sm.length > local:
                    out.append(Candidate(Source.R, sm.length, match=sm))
        return out

    def _best_live(self, adm: Admission) -> tuple[int, int | None, None]:
        """Another slot's sequence holding the longest prefix (kept idle KV or computed tokens)."""
        best, src = 0, None
        running = {s.slot.index: s for s in self.running() if s.slot is not None and s is not adm.seq}
        for slot in self.slots.slots:
            if slot is adm.slot:
                continue
            held = running[slot.index].kv_tokens() if slot.index in running else (slot.tokens if not slot.busy else [])
            n = common_prefix_len(held, adm.seq.prompt)
            if n > best:
                best, src = n, slot.seq_id
        for copy in self.parked.queue if self.parked is not None else ():  # a slot's KV waiting for write-back
            n = common_prefix_len(copy.tokens, adm.seq.prompt)
            if n > best:
                best, src = n, copy.seq_id
        return best, src, None

    def plan(self, cands: list[Candidate], prompt_len: int) -> tuple[Candidate | None, Plan]:
        """The candidate to commit (None: compute everything) and the plan behind it."""
        a_len = next((c.length for c in cands if c.source is Source.A), 0)
        s_len = next((c.length for c in cands if c.source is Source.S), 0)
        # H, D and R restore only what neither the slot (A) nor a shared device copy (S) holds
        device = max(a_len, s_len)
        options = [PlanOption(c.source.value, c.length, c.length - min(device, c.length) if c.source in STORED else 0)
                   for c in cands if c.length > 0]
        plan = self.costs.choose(options, prompt_len, longest=self.route == "longest")
        chosen = next((c for c in cands if c.source == plan.option.source), None)
        return chosen, plan

    # ------------------------------------------------------------- committing
    def provide(self, adm: Admission) -> CacheReport:
        t0 = time.perf_counter()
        try:
            return self._provide(adm)
        finally:
            dt = time.perf_counter() - t0
            self.lease(adm.seq).overhead_s += dt
            self.engine_ms += dt * 1000.0
            self.max_step_cache_ms = max(self.max_step_cache_ms, dt * 1000.0)

    def _provide(self, adm: Admission) -> CacheReport:
        cands = self.candidates(adm)
        best, plan = self.plan(cands, len(adm.seq.prompt))
        lease = self.lease(adm.seq)
        lease.plan = plan
        a_len = next((c.length for c in cands if c.source is Source.A), 0)
        slot_seq = adm.slot.seq_id
        self._note_plan(adm, cands, plan)
        kept = {"A": plan.option.length, "H": min(a_len, plan.option.length),
                "D": min(a_len, plan.option.length), "R": min(a_len, plan.option.length)}.get(plan.option.source, 0)
        if kept < len(adm.slot.tokens):
            # Parked only when other requests are decoding: a store in one go then stalls them.
            # Alone, the store goes now, and the new prompt lands in the cells it frees (the
            # same layout as before: parked cells move it, which can flip a greedy near tie).
            self._write_back(adm.slot, exclude=adm.slot,
                             park=any(s is not adm.seq and s.slot is not None for s in self.running()))
        if best is None:
            self.runtime.seq_rm(slot_seq, -1, -1)
            self.by_source["none"] += 1
            return CacheReport(est_ms=plan.est_ms)
        try:
            report = self._commit(best, slot_seq, a_len, next((c for c in cands if c.source is Source.S), None), lease)
            if best.source in READ_AHEAD and report.source == best.source:
                self._read_ahead(lease, best, report.reused_tokens, slot_seq)
                return replace(report, loading=True, plan=plan.label, est_ms=plan.est_ms)
        except (RestoreError, DiskSegmentError, ExtractError) as exc:
            log.warning("cache %s failed for request %d (%s); computing the prompt instead", best.source, adm.seq.id, exc)
            self.runtime.seq_rm(slot_seq, -1, -1)
            self.fallbacks += 1
            self.by_source["none"] += 1
            return CacheReport(est_ms=plan.est_ms)
        self.by_source[best.source] += 1
        self.reused_tokens[best.source] += report.reused_tokens
        return replace(report, plan=plan.label, est_ms=plan.est_ms)

    def _note_plan(self, adm: Admission, cands: list[Candidate], plan: Plan) -> None:
        self.by_plan[plan.label] += 1
        longest = max((c.length for c in cands), default=0)
        if plan.option.length < longest:
            self.shorter_than_longest += 1
        self.recent_plans.append({
            "request": adm.seq.id, "prompt_tokens": len(adm.seq.prompt), "plan": plan.label,
            "reused_tokens": plan.option.length, "est_ms": _ms(plan.est_ms),
            "candidates": {c.source: {"tokens": c.length, "est_ms": _ms(plan.estimates.get(c.source))}
                           for c in cands if c.length > 0},
            "compute_all_est_ms": _ms(plan.estimates.get("none")),
            **({"probe": True} if plan.probe else {}),
        })

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
        # duplicating them), and restore only the rest.
        keep = min(a_len, c.length)
        if shared is not None and shared.src_seq is not None and min(shared.length, c.length) > keep:
            keep = min(shared.length, c.length)
            self._attach(shared, slot_seq, keep)
            if keep == c.length:  # nothing left to restore (the plan prefers S then; kept for safety)
                return CacheReport(Source.S.value, keep)
        elif not self.runtime.seq_rm(slot_seq, keep, -1):
            self.runtime.seq_rm(slot_seq, -1, -1)
            keep = 0
        if c.source in READ_AHEAD:  # read on an I/O thread; the restore follows in advance_loads
            return CacheReport(c.source.value, keep)
        t0 = time.perf_counter()
        result = self._restore_host(c, keep, slot_seq, lease)
        seconds = time.perf_counter() - t0
        self.costs.observe_restore(c.source.value, result.nbytes, seconds, result.n_tokens)
        return CacheReport(c.source.value, c.length, result.nbytes, seconds * 1000.0)

    # -------------------------------------------------------- read ahead (D, R)
    def _read_ahead(self, lease: CacheLease, c: Candidate, keep: int, slot_seq: int) -> None:
        """Start reading the disk (or shared-store) part of a plan on an I/O thread; the slot
        already holds prompt[:keep]. The engine decodes other requests meanwhile (as SGLang's
        HiCache loads back ahead of compute); `advance_loads` restores what was read."""
        tier: KVTier = self.shared if c.source is Source.R else self.disk

        def read() -> tuple[list, float]:
            t0 = time.perf_counter()
            return tier.load(c.match, keep), time.perf_counter() - t0

        pool = self._net if c.source is Source.R else self._io
        lease.kept = keep
        lease.load = PendingLoad(c, slot_seq, pool.submit(read), time.perf_counter())

    def _loads_done(self) -> list[Sequence]:
        """The waiting requests whose read ahead finished, in admission order."""
        return [s for s in self.running() if s.cache_lease is not None and s.cache_lease.load is not None
                and s.cache_lease.load.future.done()]

    def loads_ready(self) -> bool:
        return bool(self._loads_done())

    def advance_loads(self) -> list[tuple[Sequence, CacheReport]]:
        """Restore the reads ahead that finished (engine thread); a failed read or restore
        falls back to computing the prompt. A request that ended meanwhile is skipped."""
        out = []
        for seq in self._loads_done():
            lease = seq.cache_lease
            ld, lease.load = lease.load, None
            if seq.status is SeqStatus.FINISHED:
                continue
            t0 = time.perf_counter()
            try:
                out.append((seq, self._restore_read(seq, ld, lease.plan)))
            finally:
                dt = time.perf_counter() - t0
                self.engine_ms += dt * 1000.0
                self.max_step_cache_ms = max(self.max_step_cache_ms, dt * 1000.0)
                # the wait for the read is not the request's compute either (cost model)
                lease.overhead_s += time.perf_counter() - ld.started
        return out

    def _restore_read(self, seq: Sequence, ld: PendingLoad, plan: Plan) -> CacheReport:
        try:
            segments, read_s = ld.future.result()
            t0 = time.perf_counter()
            result = self.kv.restore(segments, ld.slot_seq)
        except Exception as exc:  # noqa: BLE001 - a cache may make a request slower, never fail it
            log.warning("cache %s failed for request %d (%s); computing the prompt instead", ld.cand.source,
                        seq.id, exc)
            self.runtime.seq_rm(ld.slot_seq, -1, -1)
            self.fallbacks += 1
            self.by_source["none"] += 1
            return CacheReport(est_ms=plan.est_ms)
        seconds = read_s + time.perf_counter() - t0
        src = ld.cand.source.value
        self.costs.observe_restore(src, result.nbytes, seconds, result.n_tokens)
        self.by_source[src] += 1
        self.reused_tokens[src] += ld.cand.length
        return CacheReport(src, ld.cand.length, result.nbytes, seconds * 1000.0, plan=plan.label,
                           est_ms=plan.est_ms)

    def _attach(self, c: Candidate, slot_seq: int, length: int) -> None:
        """Give the slot positions [0, length) of the S candidate's cells. The slot's own copy is
        dropped entirely: attaching shares the other sequence's cells, so the slot's duplicates
        are freed (one physical copy of the prefix)."""
        self.runtime.seq_rm(slot_seq, -1, -1)
        self.runtime.seq_cp(c.src_seq, slot_seq, 0, length)
        if self.runtime.seq_pos_max(slot_seq) != length - 1:
            raise RestoreError("attaching the shared prefix did not give the expected cells")
        if c.owner is not None:
            self.resident.note_attach(c.owner)

    def _restore_host(self, c: Candidate, keep: int, slot_seq: int, lease: CacheLease):
        """Restore from H, the lease holding a lock reference on the matched path, so no store
        or flush evicts it while it is read (the segments are views: they stay valid anyway)."""
        with self.tree.mutex:
            lease.lock(self.tree, c.match.tip)
        try:
            return self.kv.restore(self.host.load(c.match, keep), slot_seq)
        finally:
            with self.tree.mutex:
                lease.unlock(self.tree)

    # ------------------------------------------------- in-flight sharing (defer)
    def should_defer(self, seq: Sequence) -> bool:
        """Wait for a running request that is computing a long prefix this one shares."""
        if Source.S not in self.tiers:
            return False
        for other in self.running():
            if other.status is not SeqStatus.PREFILLING:
                continue
            shared = common_prefix_len(other.prompt, seq.prompt)
            # choices of one request (n > 1) share their prompt however short it is
            grouped = seq.request.prefill_group is not None and other.request.prefill_group is seq.request.prefill_group
            if (shared >= self.min_tokens or grouped) and other.n_past < min(shared, len(seq.prompt) - 1):
                lease = self.lease(seq)
                if not lease.deferred:
                    lease.deferred = True
                    self.deferrals += 1
                return True
        return False

    # --------------------------------------------------------------- finishing
    def on_finished(self, seq: Sequence, reason: str) -> None:
        t0 = time.perf_counter()
        lease = self.lease(seq)
        try:
            self._on_finished(seq, reason, lease)
        finally:
            lease.release(self.tree)
            seq.cache_lease = None
            self.engine_ms += (time.perf_counter() - t0) * 1000.0

    def _on_finished(self, seq: Sequence, reason: str, lease: CacheLease) -> None:
        hint = lease.hint
        if seq.slot is None:
            return
        if reason == "error":
            self._slot_hints.pop(seq.slot.index, None)
            return
        self._observe_prefill(seq, lease)
        tokens = seq.kv_tokens()
        if len(tokens) >= self.min_tokens:
            self._publish(seq, tokens, hint)
        if hint is not None:
            self._observe_hint(hint, tokens)
            self._slot_hints[seq.slot.index] = hint

    # ------------------------------------------------------------- write-back
    def drop_idle_slot(self, slot) -> None:
        """Free an idle slot's KV (e.g. for room), copying it to host/disk first if no
        other device copy holds it."""
        if slot.busy:
            raise ValueError(f"slot {slot.index} is running a request")
        self._write_back(slot, exclude=slot)
        self.runtime.seq_rm(slot.seq_id, -1, -1)
        slot.tokens = []

    def drop_device_copies(self) -> None:
        """Drop every idle slot's KV and every resident owner, writing back first what
        host/disk lack (what a KV shortage would do to all of them; tests, benchmarks)."""
        if self.parked is not None:
            self.parked.drain()
        for slot in self.slots.slots:
            if not slot.busy:
                self.drop_idle_slot(slot)
        if self.resident is not None:
            for owner in list(self.resident.owners):
                self._write_back_owner(owner.seq_id, owner.tokens)
            self.resident.flush()

    def _write_back(self, slot, exclude=None, park: bool = False) -> None:
        """The slot's kept KV is about to be lost: store what host/disk lack of it, now or
        (`park`, when parking is on) piece by piece over the next engine steps."""
        tokens = list(slot.tokens)
        if len(tokens) < self.min_tokens or self._held_on_device(tokens, exclude):
            return
        hint = self._slot_hints.pop(slot.index, None)

        def tag(tip) -> None:
            if hint is not None and hint.session and tip is not None:
                with self.tree.mutex:
                    self.registry.tag(hint.session, tip)

        if park and self.parked is not None and self.parked.park(slot.seq_id, tokens, tag):
            self.write_backs += 1  # its time is counted piece by piece in `background`
            return
        tag(self._timed_store(slot.seq_id, tokens))

    def background(self, idle: bool) -> None:
        """Once per engine step: hold the pinned KV to its quota, free idle slots beyond the
        idle-cell limit while requests run, then store the next piece of parked copies (all of
        them when the engine is idle)."""
        self._enforce_pin_quota()
        if not idle and self.idle_cells is not None:
            self._offload_idle_slots()
        if self.parked is None or not self.parked.queue:
            return
        t0 = time.perf_counter()
        try:
            self.parked.drain() if idle else self.parked.advance()
        finally:
            ms = (time.perf_counter() - t0) * 1000.0
            self.engine_ms += ms
            self.write_back_ms += ms
            if not idle:
                self.max_step_cache_ms = max(self.max_step_cache_ms, ms)

    def _enforce_pin_quota(self) -> None:
        """The pinned-bytes quota (SessionRegistry.enforce_pinned_bytes: the oldest pins are
        released until the H and D values of pinned nodes fit). The walk over the tree runs
        only when a pin or the tree's H/D contents changed since the last one."""
        reg, tree = self.registry, self.tree
        if tree is None or reg.max_pinned_bytes is None:
            return
        if reg.n_pinned == 0 and reg.pinned_bytes == 0:
            return  # the common case, at every engine step: nothing pinned, nothing to walk
        h, d = tree.counters("H"), tree.counters("D")
        signature = (reg.pin_epoch, tree.n_nodes, h.n_payloads, h.held_bytes, d.n_payloads, d.held_bytes)
        if signature == self._pin_signature:
            return
        with tree.mutex:
            reg.enforce_pinned_bytes(tree.nodes(), _stored_bytes)
        h, d = tree.counters("H"), tree.counters("D")  # releases change only the epoch
        self._pin_signature = (reg.pin_epoch, tree.n_nodes, h.n_payloads, h.held_bytes, d.n_payloads, d.held_bytes)

    def _offload_idle_slots(self) -> None:
        """While requests run, idle slots keep at most `idle_cells` cells: under unified KV
        every kept cell is read (and masked out) by every running request's attention at every
        step, so a prefix nobody uses now costs all of them. The least recently used idle slots
        beyond the limit are written back (parked: stored piece by piece over the next steps)
        and freed; their next request restores from host instead of finding them in place."""
        holding = [s for s in self.slots.idle if s.tokens]
        kept = sum(len(s.tokens) for s in holding)
        if kept <= self.idle_cells:
            return
        t0 = time.perf_counter()
        try:
            for slot in sorted(holding, key=lambda s: s.last_used):
                if kept <= self.idle_cells:
                    break
                kept -= len(slot.tokens)
                self._write_back(slot, exclude=slot, park=True)
                self.runtime.seq_rm(slot.seq_id, -1, -1)
                slot.tokens = []
                self._slot_hints.pop(slot.index, None)
                self.idle_offloads += 1
        finally:
            ms = (time.perf_counter() - t0) * 1000.0
            self.engine_ms += ms
            self.max_step_cache_ms = max(self.max_step_cache_ms, ms)

    def _write_back_owner(self, seq_id: int, tokens: list[int]) -> None:
        """A resident owner is being evicted (its cells may be freed)."""
        if len(tokens) >= self.min_tokens and not self._held_on_device(tokens, None, owner_seq=seq_id):
            self._timed_store(seq_id, tokens)

    def _timed_store(self, seq_id: int, tokens: list[int]):
        if self.host is None and self.disk is None:
            return None  # nowhere to write back to (e.g. tiers A,S)
        t0 = time.perf_counter()
        try:
            return self._store(seq_id, tokens)
        finally:
            self.write_backs += 1
            self.write_back_ms += (time.perf_counter() - t0) * 1000.0

    def _held_on_device(self, tokens: list[int], exclude, owner_seq: int | None = None) -> bool:
        """Another slot (idle, or running over these tokens) or resident owner holds them all."""
        running = {s.slot.index: s.kv_tokens() for s in self.running() if s.slot is not None}
        for slot in self.slots.slots:
            if slot is exclude:
                continue
            held = running.get(slot.index, slot.tokens if not slot.busy else [])
            if common_prefix_len(held, tokens) == len(tokens):
                return True
        return self.resident is not None and self.resident.holds(tokens, exclude=owner_seq)

    def _observe_hint(self, hint, tokens: list[int]) -> None:
        """Record a request's hint, tagging the path to the deepest tree node on `tokens`
        (whichever source holds it). Tags are written under the tree's mutex: the disk
        writer may split a node meanwhile, and a split copies the node's tags."""
        if self.tree is None:
            self.registry.observe(hint, None)
            return
        with self.tree.mutex:
            node = self.tree.match_prefix(tokens, touch=False).last_node
            self.registry.observe(hint, None if node.is_root else node)

    def _observe_prefill(self, seq: Sequence, lease: CacheLease) -> None:
        """Computed prompt tokens over admission-to-first-token, less the cache's own work."""
        if seq.t_first_token is None or seq.t_prefill_start is None:
            return
        seconds = seq.t_first_token - seq.t_prefill_start - lease.overhead_s
        self.costs.observe_prefill(len(seq.prompt) - seq.n_cached, seconds)

    def _store(self, slot_seq: int, tokens: list[int], to_disk: bool = True):
        """Store what the host (and, with `to_disk`, the disk and the shared store) lacks of
        `tokens`, read from `slot_seq`; returns the host path's tip, or None."""
        if self.host is None and self.disk is None:
            return None
        try:
            if self.host is not None:
                result = self.host.store(tokens, lambda s, e: self.kv.extract(slot_seq, s, e))
                if result is None:
                    return None
                below = [t for t in (self.disk, self.shared) if t is not None]  # each queues for its writer
                if to_disk and below and result.last_node.attached:
                    with self.tree.mutex:
                        path = [n for n in result.last_node.iter_up()][::-1]
                        ranges = [(n.start(), n.values["H"]) for n in path if "H" in n.values]
                    for tier in below:
                        tier.store(tokens, ranges)
                return result.last_node if result.last_node.attached else None
            have = self.disk.held(tokens)  # whole or partial: what is on disk already
            if have < len(tokens):
                self.disk.store(tokens, [(have, self.kv.extract(slot_seq, have, len(tokens)))])
        except ExtractError as exc:
            self.store_errors += 1
            log.warning("could not store the request's KV: %s", exc)
        return None

    def _publish(self, seq: Sequence, tokens: list[int], hint) -> None:
        """Keep the request's common prefix resident: the part it shared with earlier work
        (what it reused, or what another slot still holds), or all of it when pinned."""
        if self.resident is None:
            return
        common = seq.n_cached
        for slot in self.slots.slots:
            if slot is not seq.slot and not slot.busy:
                common = max(common, common_prefix_len(slot.tokens, tokens))
        if hint is not None and (hint.pin or (hint.pin is None and hint.session is not None
                                              and self.registry.is_pinned(hint.session))):
            common = len(tokens)  # pinned by this request or by an earlier hint (POST /cache/hint)
        if common >= self.min_tokens:
            self.resident.publish(tokens[:common], seq.slot.seq_id, hint)

    # ------------------------------------------------------------- operations
    def reclaim(self, slots: SlotPool) -> bool:
        """Free cells for running requests: a parked copy first (stored to its end: its cells
        were going anyway), then idle slots' kept KV (oldest first), then resident owners
        (lifecycle order), each written back to host/disk first. Pinned owners stay."""
        if self.parked is not None and self.parked.finish_one():
            return True
        if slots.drop_oldest_idle(self.drop_idle_slot):
            return True
        return self.resident is not None and self.resident.evict_one()

    def stats(self) -> dict:
        """Everything the cache reports (/cache/stats, /metrics), from counters read without
        any lock the engine thread holds: a scrape never waits for a store or a restore."""
        tree = self.tree
        return {
            "route": self.route,
            "costs": self.costs.stats(),
            "plans": {"by_plan": dict(self.by_plan), "shorter_than_longest": self.shorter_than_longest,
                      "recent": list(self.recent_plans)},
            "requests_by_source": dict(self.by_source),
            "reused_tokens_by_source": dict(self.reused_tokens),
            "fallbacks": self.fallbacks,
            "deferrals": self.deferrals,
            "tiers": {
                "A": {"enabled": "A" in self.tiers, "slots": len(self.slots.slots),
                      "idle_tokens_kept": sum(len(x.tokens) for x in tuple(self.slots.slots) if not x.busy),
                      "idle_cells_limit": self.idle_cells, "idle_offloads": self.idle_offloads},
                "S": self.resident.stats() if self.resident else {"enabled": False},
                "H": self.host.stats() if self.host else {"enabled": False},
                "D": self.disk.stats() if self.disk else {"enabled": False},
                "R": self.shared.stats() if self.shared else {"enabled": False},
            },
            # the shared tree's size: nodes, tokens on them, and tokens some owner holds
            "tree": None if tree is None else {"nodes": tree.n_nodes, "tokens": tree.n_tokens,
                                               "held_tokens": tree.held_tokens},
            "parked_cells": self.parked.cells() if self.parked else 0,
            "write_back": self.parked.stats() if self.parked else {"enabled": False},
            "lifecycle": self.registry.summary(),
            "engine_thread": {"cache_ms": round(self.engine_ms, 3), "write_backs": self.write_backs,
                              "write_back_ms": round(self.write_back_ms, 3),
                              "max_step_cache_ms": round(self.max_step_cache_ms, 3)},
        }

    def close(self) -> None:
        """After the engine stopped: finish the reads ahead, the disk and shared-store writes."""
        if self._io is not None:
            self._io.shutdown(wait=True)
        if self._net is not None:
            self._net.shutdown(wait=True)
        if self.disk is not None:
            self.disk.close()
        if self.shared is not None:
            self.shared.close()

    def flush(self) -> dict:
        freed = {}
        if self.parked is not None:
            freed["parked_cells"] = self.parked.discard()
        if self.host is not None:
            freed["H"] = self.host.flush()
        if self.disk is not None:
            freed["D"] = self.disk.flush()
        if self.resident is not None:
            freed["S_cells"] = self.resident.flush()
        return freed


def _stored_bytes(node) -> int:
    """The KV bytes a node's H and D values hold (what a pin keeps from being evicted there)."""
    return sum(node.values[t].nbytes for t in ("H", "D") if t in node.values)


def _ms(x: float | None) -> float | None:
    return None if x is None else round(x, 3)
