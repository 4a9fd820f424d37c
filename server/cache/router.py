"""The prefix router: the engine's PrefixProvider. For each admitted request, the longest
executable prefix among

- A: the slot's own kept KV,
- S: KV already in the unified cache under another sequence: a resident owner, or another
     slot (idle or running) whose computed tokens share the prefix; attached with seq_cp (in the
     split KV layout, a stream per slot: copied from that sequence's stream, at a cost of its own),
- H: segments in host RAM, restored,
- D: segment files on disk, restored,
- R: chunks in a store shared by replicas (Redis/Valkey, server/cache/shared_tier.py),
     asked at admission, read ahead like D, restored,

one plan committed per request: with route `cost` (the default) the plan with the lowest
estimated time to first token from rates measured online (server/cache/cost.py), with
route `longest` the longest match; ties A > S > H > D > R. Requests that arrive while another
one is still computing a long common prefix wait for it and then attach (in-flight sharing).

This module is a facade over one concern per module:
- server/cache/candidates.py: the candidates, from other slots, running requests and the tree;
- server/cache/planner.py: candidates -> plan (pure: no llama.cpp), the plan counters;
- server/cache/restore.py: executing the plan (attach, restore, read ahead, fall back to
  computing on any failure), the counters of what was served;
- server/cache/write_back_policy.py: when KV is copied to host/disk (write-back, parked,
  idle-cell limit, pin quota) and what a finished request leaves resident;
- server/cache/lease.py: the request's cache state, on the request;
- server/cache/cache_stats.py: what the cache reports.

The stored tiers (H, D, R) are one collection ordered fastest first, each a `KVTier` (server/
cache/tiers.py), which the parts go through instead of naming each tier. Resident owners, H
and D are recorded on the nodes of one radix tree (server/cache/radix_tree.py), so one walk of
it says how far a prompt is held in each. Slots stay
per-slot token lists: a running slot's tokens change at every decode step, so indexing them
would cost a tree update per token, while scanning the few slots costs one prefix comparison
each per admission.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable, Iterator

from server.cache.cache_stats import cache_stats
from server.cache.candidates import CandidateSources
from server.cache.checkpointed_slots import SlotStates
from server.cache.engine_time import EngineTime
from server.cache.kv_ops import KVOps
from server.cache.lease import CacheLease
from server.cache.lifecycle import SessionRegistry
from server.cache.planner import ROUTES, Candidate, Planner, deferring_to, kept_in_slot, length_of
from server.cache.policy_events import PolicyEvents
from server.cache.predictive_policy import PredictivePolicy
from server.cache.prefetch import Prefetcher
from server.cache.radix_tree import RadixTree
from server.cache.restore import Restorer
from server.cache.slot_paths import slot_paths
from server.cache.tiers import ON_TREE, STORED_ON_TREE, KVTier, Source, tier_of
from server.cache.write_back_policy import WriteBackPolicy
from server.engine.llama_runtime import LlamaRuntime
from server.engine.scheduler import Admission
from server.engine.seq_ids import SequenceIdPool
from server.engine.sequence import CacheReport, Sequence
from server.engine.slots import SlotPool

__all__ = ["ROUTES", "CacheRouter", "Candidate"]


class CacheRouter:
    # the cache policy's events and report (--cache-policy; server/bootstrap.py sets it)
    events: PolicyEvents | None = None

    def __init__(self, *, runtime: LlamaRuntime, kv: KVOps, slots: SlotPool, running: Callable[[], list[Sequence]],
                 enabled: set[Source], tree: RadixTree | None, tiers: Iterable[KVTier], resident_cells: int | None,
                 registry: SessionRegistry, min_tokens: int, route: str = "cost", write_back_step_bytes: int = 0,
                 idle_cells: int | None = None, states: SlotStates | None = None, split: bool = False,
                 restore_step_bytes: int = 0, restore_beside: bool = True, write_back_beside: bool = True):
        """`enabled`: the sources in use (A and S among them); `tiers`: the stored tiers, ordered
        as server.cache.tiers.STORED (R is not on the tree: its store changes under every replica);
        `split`: the split KV layout (server/engine/kv_layout.py), where S copies between streams."""
        self.split = split
        if route not in ROUTES:
            raise ValueError(f"unknown cache route {route!r}; choose among {', '.join(ROUTES)}")
        self.runtime, self.kv, self.slots, self.running = runtime, kv, slots, running
        self.enabled, self.tree, self.registry = enabled, tree, registry
        self.tiers = tuple(tiers)
        self.min_tokens, self.route = min_tokens, route
        self.clock = EngineTime()
        self.write = WriteBackPolicy(runtime=runtime, kv=kv, slots=slots, running=running, tree=tree, tiers=self.tiers,
                                     registry=registry, min_tokens=min_tokens, resident_cells=resident_cells,
                                     step_bytes=write_back_step_bytes, idle_cells=idle_cells, clock=self.clock,
                                     copies=split, beside=write_back_beside)
        self.resident, self.parked = self.write.resident, self.write.parked
        if self.resident is not None and not split:  # the owners' budget charges cells no slot also holds
            self.resident.device_paths = self._device_paths
        # a model with sliding-window or recurrent layers: its slots' states and checkpoints (tiers
        # A, H and D only: server/bootstrap.py), the host's checkpoints for H and D
        self.states = states
        if states is not None:  # a slot's or an owner's checkpoints go with its KV to H, D and R
            assert states.store is not None
            self.write.hand_over = states.hand_over
            self.write.hand_over_owner = states.hand_over_sequence
            self.write.state_of = states.resumable
            self.write.path_checkpoints = states.store.on_path
        self.planner = Planner(enabled=enabled, tree=tree, tiers=self.tiers, resident=self.resident, route=route,
                               checkpoints=states.store if states is not None else None, copies=split)
        self.costs = self.planner.costs
        self.restorer = Restorer(runtime=runtime, kv=kv, running=running, tree=tree, tiers=self.tiers,
                                 resident=self.resident, costs=self.costs, clock=self.clock, states=states,
                                 copies=split, step_bytes=restore_step_bytes, beside=restore_beside)
        self.sources = CandidateSources(slots=slots, running=running, enabled=enabled, tree=tree,
                                        planner=self.planner, parked=self.parked, states=states)
        self.deferrals = 0  # requests deferred at least once (not deferral decisions)
        # what tests, benchmarks and the engine call here, done by the parts
        self.drop_idle_slot = self.write.drop_idle_slot
        self.drop_device_copies = self.write.drop_device_copies
        # --cache-prefetch (server/cache/prefetch.py; server/bootstrap.py sets it with the predictive policy)
        self.prefetch: Prefetcher | None = None
        self.prefetch_off: str | None = "the cache policy is not predictive (prefetch follows its predictions)"
        self.loads_ready = self.restorer.loads_ready
        self.advance_loads = self.restorer.advance_loads

    @staticmethod
    def lease(seq: Sequence) -> CacheLease:
        """The request's cache lease (server/cache/lease.py), put on it at first sight."""
        if seq.cache_lease is None:
            seq.cache_lease = CacheLease(hint=seq.request.cache_hint)
        return seq.cache_lease

    # the tiers and counters the tests and benchmarks read where they always did
    host = property(lambda self: tier_of(self.tiers, Source.H))
    disk = property(lambda self: tier_of(self.tiers, Source.D))
    shared = property(lambda self: tier_of(self.tiers, Source.R))
    fallbacks = property(lambda self: self.restorer.fallbacks)
    write_backs = property(lambda self: self.write.write_backs)
    write_backs_skipped = property(lambda self: self.write.write_backs_skipped)
    idle_offloads = property(lambda self: self.write.idle_offloads)
    recent_plans = property(lambda self: self.planner.recent_plans)
    shorter_than_longest = property(lambda self: self.planner.shorter_than_longest)
    max_step_cache_ms = property(lambda self: self.clock.max_step_ms)

    def enable_prefetch(self, policy: PredictivePolicy, seq_ids: SequenceIdPool, **settings) -> str | None:
        """Bring waiting sessions' KV up to a resident owner before their predicted call
        (server/cache/prefetch.py); the reason it cannot, or None."""
        if self.split:
            self.prefetch_off = "the split KV layout (resident owners are whole streams there)"
        elif self.states is not None:
            self.prefetch_off = "a model with sliding-window or recurrent layers (resident owners are off there)"
        elif self.resident is None or self.tree is None:
            self.prefetch_off = "no resident owners (tier S) to bring KV up to"
        elif not any(t.source in STORED_ON_TREE for t in self.tiers):
            self.prefetch_off = "no host or disk tier to bring KV up from"
        else:
            self.prefetch_off = None
            self.prefetch = Prefetcher(policy=policy, runtime=self.runtime, kv=self.kv, seq_ids=seq_ids,
                                       tree=self.tree, tiers=self.tiers, resident=self.resident, slots=self.slots,
                                       running=self.running, disk_reader=self.restorer.reader(Source.D),
                                       joiner=self.restorer.joiner, **settings)
        return self.prefetch_off

    def _device_paths(self) -> Iterator[list[int]]:
        """The token paths the slots (a running request's computed KV, else the slot's kept KV) and the
        parked copies hold in the unified KV (engine thread)."""
        for _, tokens in slot_paths(self.slots, self.running()):
            yield tokens
        for copy in self.parked.queue if self.parked is not None else ():
            yield copy.tokens

    def background(self, idle: bool) -> None:
        """Once per engine step: the owners' budget (a slot may have let go of cells they share), the
        write-back's bounded work, then the prefetch's next piece."""
        if self.resident is not None:
            t0 = time.perf_counter()
            if self.resident.enforce():  # what it evicted was written back: the write-back's time
                self.clock.add((time.perf_counter() - t0) * 1000.0, step=not idle, kind="write_back")
        self.write.background(idle)
        if self.prefetch is not None:
            t0 = time.perf_counter()
            try:
                self.prefetch.step(idle)
            finally:
                self.clock.add((time.perf_counter() - t0) * 1000.0, step=not idle, kind="prefetch")

    def idle_work(self) -> float | None:
        """The engine is idle: a due prefetch runs whole; while waiting sessions are known, call again
        within a fraction of the lifecycle model's step (their values change with time)."""
        if self.prefetch is None:
            return None
        self.background(idle=True)
        return self.prefetch.tick_s if self.prefetch.last else None

    # ------------------------------------------------------------- admission
    def provide(self, adm: Admission) -> CacheReport:
        t0 = time.perf_counter()
        try:
            return self._provide(adm)
        finally:
            dt = time.perf_counter() - t0
            self.lease(adm.seq).overhead_s += dt
            # a stall only where another request computes (alone, the admission delays no one)
            self.clock.add(dt * 1000.0, step=self.restorer.others_computing(adm.slot.seq_id))

    def _provide(self, adm: Admission) -> CacheReport:
        prompt = adm.seq.cache_prompt  # its cache key: a namespace's prompt matches only its own KV
        self.write.admitted(prompt)  # the write-back gate learns whether lost copies come back
        hint = self.lease(adm.seq).hint
        if self.events is not None:
            self.events.arrived(hint, prompt)
        if self.prefetch is not None:  # its session's prefetch, if one runs, ends before the plan
            self.prefetch.arrived(hint.session if hint is not None else None)
        if self.parked is not None and Source.S not in self.enabled:
            self.parked.finish_matching(prompt[:len(prompt) - 1], self.min_tokens)  # H must hold what it needs
        cands = self.sources.candidates(adm)
        best, plan = self.planner.plan(cands, len(prompt))
        lease = self.lease(adm.seq)
        lease.plan = plan
        self.planner.note(adm.seq.id, len(prompt), cands, plan)
        if kept_in_slot(plan, length_of(cands, Source.A)) < len(adm.slot.tokens):
            # Parked only when other requests are decoding: a store in one go then stalls them.
            # Alone, the store goes now, and the new prompt lands in the cells it frees (the
            # same layout as before: parked cells move it, which can flip a greedy near tie).
            self.write.write_back(adm.slot, exclude=adm.slot,
                                  park=any(s is not adm.seq and s.slot is not None for s in self.running()))
        report = self.restorer.execute(adm, best, plan, cands, lease)
        if self.resident is not None:  # the slot let go of what it held beyond its new prompt's prefix
            self.resident.enforce()
        if self.states is not None:
            self.states.set_stops(adm.seq, report.reused_tokens)
            # a branch point: where this prompt leaves what the cache already knows, the next
            # prompt of the same family will want the state too (a shared system prompt)
            known = lease.branch_point = self.sources.known_prefix(adm, prompt)
            if known > report.reused_tokens:
                self.states.add_stop(adm.seq, known)
        return report

    def should_defer(self, seq: Sequence) -> bool:
        """Wait for a running request that is computing a long prefix this one shares."""
        if Source.S not in self.enabled:
            return False
        waiting_for = deferring_to(seq, self.running(), self.min_tokens)
        if waiting_for is None:
            return False
        if self.states is not None:  # the state where this one will take over must be kept
            self.states.add_stop(*waiting_for)
        lease = self.lease(seq)
        if not lease.deferred:
            lease.deferred = True
            self.deferrals += 1
        return True

    def checkpoint(self, seq: Sequence, pos: int) -> None:
        """A prefill chunk ended at one of the request's stops (models with sliding-window or
        recurrent layers only: a full-attention model's KV is cut back to any prefix, and no
        stops are set for it)."""
        if self.states is not None:
            self.states.capture(seq, pos)

    # --------------------------------------------------------------- finishing
    def on_finished(self, seq: Sequence, reason: str) -> None:
        t0 = time.perf_counter()
        lease = self.lease(seq)
        try:
            if seq.slot is not None and reason == "error":
                self.write.slot_hints.pop(seq.slot.index, None)
                if self.states is not None:  # the runner cleared the slot's KV
                    self.states.of(seq.slot).clear()
            elif seq.slot is not None:
                self._observe_prefill(seq, lease)
            # the policy learns the session's new state first, so what the request leaves resident is
            # ranked by it (a tool wait's expected return, not a running request's certain use)
            if self.events is not None and seq.slot is not None:
                self.events.ended(lease.hint, len(seq.prompt), seq.n_cached, seq.cache_prompt, reason == "error")
            if seq.slot is not None and reason != "error":
                self.write.finished(seq, lease.hint, shared=lease.branch_point)
            if self.prefetch is not None and seq.slot is not None and reason != "error" and lease.hint is not None:
                self.prefetch.ended(lease.hint.session, lease.hint.state, seq.cache_prompt)
        finally:
            lease.release(self.tree)
            seq.cache_lease = None
            self.clock.add((time.perf_counter() - t0) * 1000.0, step=False)

    def _observe_prefill(self, seq: Sequence, lease: CacheLease) -> None:
        """Computed prompt tokens over admission-to-first-token, less the cache's own work."""
        if seq.t_first_token is None or seq.t_prefill_start is None:
            return
        seconds = seq.t_first_token - seq.t_prefill_start - lease.overhead_s
        self.costs.observe_prefill(len(seq.prompt) - seq.n_cached, seconds)

    # ------------------------------------------------------------- operations
    def reclaim(self, slots: SlotPool) -> bool:
        """Free cells for running requests: a parked copy first (stored to its end: its cells
        were going anyway), then idle slots' kept KV (oldest first), then resident owners
        (lifecycle order), each written back to host/disk first. Pinned owners stay."""
        if self.parked is not None and self.parked.finish_one():
            return True
        if slots.drop_oldest_idle(self.drop_idle_slot):
            return True
        return self.resident is not None and self.resident.evict_one(why="KV full")

    def stats(self) -> dict:
        """Everything the cache reports (server/cache/cache_stats.py)."""
        return cache_stats(self)

    def close(self) -> None:
        """After the engine stopped: finish the reads ahead, the stored tiers' (disk, shared-store)
        and checkpoint writes."""
        if self.prefetch is not None:
            self.prefetch.close()
        self.restorer.close()
        for tier in self.tiers:
            tier.close()
        if self.states is not None and self.states.store is not None:  # its disk writes
            self.states.store.close()

    def flush(self) -> dict:
        freed = {}
        if self.parked is not None:
            freed["parked_cells"] = self.parked.discard()
        for tier in self.tiers:
            if tier.source in ON_TREE:  # this replica's own (R's store is every replica's)
                freed[tier.source] = tier.flush()
        if self.resident is not None:
            freed["S_cells"] = self.resident.flush()
        if self.states is not None and self.states.store is not None:
            freed["checkpoints"] = self.states.store.clear()
        return freed
