"""When a device copy of KV is copied to host (and disk, and the shared store), and what a
finished request leaves on the device: the write-back policy beside server/cache/write_back.py
(which stores a parked copy piece by piece).

Contracts:
- Write-back, never write-through: a slot's kept KV (A) or a resident owner's (S) is stored
  only when it is about to be lost (the slot taken for another prefix, an owner evicted, an
  idle slot dropped for room or beyond the idle-cell limit), only what the host (and below
  it, disk and shared store) lacks, and not at all when another slot or owner still holds all
  its tokens, or when it is shorter than `min_tokens`.
- A slot taken while other requests decode is parked (`park=True`, when parking is on) and
  stored a bounded piece per engine step (`background`); otherwise it is stored at once.
  A stored slot's path is tagged with the session of the hint its last request carried
  (`slot_hints`: a slot's kept KV outlives its request and its lease).
- `finished(seq, hint)`: a completed request's common prefix (what it reused, or what an idle
  slot still holds; all of it when pinned) is published as resident (tier S), its hint
  recorded on the deepest tree node it reached.
- `background(idle)`, once per engine step: the pinned-bytes quota (walked only when a pin
  or the tree's H/D contents changed), the idle-cell limit, the next parked pieces.
- Counters: `write_backs`, `write_back_ms`, `idle_offloads`, `store_errors`; cache time on
  the engine thread goes to the shared EngineTime.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from typing import cast

from server.cache.disk_tier import DiskTier
from server.cache.engine_time import EngineTime
from server.cache.host_tier import HostTier
from server.cache.kv_format import KVSegment
from server.cache.kv_ops import ExtractError, KVOps
from server.cache.lifecycle import CacheHint, SessionRegistry
from server.cache.radix_tree import RadixTree
from server.cache.resident import ResidentOwners
from server.cache.shared_tier import SharedTier
from server.cache.write_back import WriteBackQueue
from server.engine.llama_runtime import LlamaRuntime
from server.engine.sequence import Sequence
from server.engine.slots import SlotPool, common_prefix_len

log = logging.getLogger(__name__)


class WriteBackPolicy:
    def __init__(self, *, runtime: LlamaRuntime, kv: KVOps, slots: SlotPool, running: Callable[[], list[Sequence]],
                 tree: RadixTree | None, host: HostTier | None, disk: DiskTier | None, shared: SharedTier | None,
                 registry: SessionRegistry, min_tokens: int, resident_cells: int | None, step_bytes: int,
                 idle_cells: int | None, clock: EngineTime):
        self.runtime, self.kv, self.slots, self.running = runtime, kv, slots, running
        self.tree, self.host, self.disk, self.shared = tree, host, disk, shared
        self.registry, self.min_tokens, self.clock = registry, min_tokens, clock
        # Resident owners (tier S, when `resident_cells` is given) write back through this policy.
        self.resident: ResidentOwners | None = None
        if resident_cells is not None:
            assert tree is not None  # S is indexed in the tree
            self.resident = ResidentOwners(tree, runtime, kv.seq_ids, resident_cells, registry,
                                           on_evict=self.write_back_owner)
        # Parking needs the host tier (a stored path grows piece by piece there) and parked ids.
        self.parked = (WriteBackQueue(runtime, kv.seq_ids, self.store, lambda: host.bytes_per_token, step_bytes)
                       if host is not None and step_bytes > 0 and kv.seq_ids.layout.parked else None)
        # slot index -> the cache hint of its last request: the slot's kept KV (tier A) outlives
        # the request and its lease, and is written back later under that hint
        self.slot_hints: dict[int, CacheHint] = {}
        self.idle_cells = idle_cells  # cells idle slots may keep while requests run (None: no limit)
        self.idle_offloads = 0  # idle slots written back and freed for that limit
        self.write_backs = 0
        self.write_back_ms = 0.0
        self.store_errors = 0
        self._pin_signature: tuple | None = None  # what the pinned-bytes quota last looked at

    # ------------------------------------------------------------ device copies lost
    def write_back(self, slot, exclude=None, park: bool = False) -> None:
        """The slot's kept KV is about to be lost: store what host/disk lack of it, now or
        (`park`, when parking is on) piece by piece over the next engine steps."""
        tokens = list(slot.tokens)
        if len(tokens) < self.min_tokens or self.held_on_device(tokens, exclude):
            return
        hint = self.slot_hints.pop(slot.index, None)

        def tag(tip) -> None:
            if hint is not None and hint.session and tip is not None:
                assert self.tree is not None  # a stored path's tip is in the tree
                with self.tree.mutex:
                    self.registry.tag(hint.session, tip)

        if park and self.parked is not None and self.parked.park(slot.seq_id, tokens, tag):
            self.write_backs += 1  # its time is counted piece by piece in `background`
            return
        tag(self._timed_store(slot.seq_id, tokens))

    def drop_idle_slot(self, slot) -> None:
        """Free an idle slot's KV (e.g. for room), copying it to host/disk first if no
        other device copy holds it."""
        if slot.busy:
            raise ValueError(f"slot {slot.index} is running a request")
        self.write_back(slot, exclude=slot)
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
                self.write_back_owner(owner.seq_id, owner.tokens)
            self.resident.flush()

    def write_back_owner(self, seq_id: int, tokens: list[int]) -> None:
        """A resident owner is being evicted (its cells may be freed)."""
        if len(tokens) >= self.min_tokens and not self.held_on_device(tokens, None, owner_seq=seq_id):
            self._timed_store(seq_id, tokens)

    def held_on_device(self, tokens: list[int], exclude, owner_seq: int | None = None) -> bool:
        """Another slot (idle, or running over these tokens) or resident owner holds them all."""
        running = {s.slot.index: s.kv_tokens() for s in self.running() if s.slot is not None}
        for slot in self.slots.slots:
            if slot is exclude:
                continue
            held = running.get(slot.index, slot.tokens if not slot.busy else [])
            if common_prefix_len(held, tokens) == len(tokens):
                return True
        return self.resident is not None and self.resident.holds(tokens, exclude=owner_seq)

    def _timed_store(self, seq_id: int, tokens: list[int]):
        if self.host is None and self.disk is None:
            return None  # nowhere to write back to (e.g. tiers A,S)
        t0 = time.perf_counter()
        try:
            return self.store(seq_id, tokens)
        finally:
            self.write_backs += 1
            self.write_back_ms += (time.perf_counter() - t0) * 1000.0

    def store(self, slot_seq: int, tokens: list[int], to_disk: bool = True):
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
                    assert self.tree is not None  # the host tier's
                    with self.tree.mutex:
                        path = [n for n in result.last_node.iter_up()][::-1]
                        ranges = [(n.start(), cast(KVSegment, n.values["H"])) for n in path if "H" in n.values]
                    for tier in below:
                        tier.store(tokens, ranges)
                return result.last_node if result.last_node.attached else None
            assert self.disk is not None  # no host tier: the disk is where it goes
            have = self.disk.held(tokens)  # whole or partial: what is on disk already
            if have < len(tokens):
                self.disk.store(tokens, [(have, self.kv.extract(slot_seq, have, len(tokens)))])
        except ExtractError as exc:
            self.store_errors += 1
            log.warning("could not store the request's KV: %s", exc)
        return None

    # ------------------------------------------------------------- finished requests
    def finished(self, seq: Sequence, hint) -> None:
        tokens = seq.kv_tokens()
        if len(tokens) >= self.min_tokens:
            self._publish(seq, tokens, hint)
        if hint is not None:
            self._observe_hint(hint, tokens)
            self.slot_hints[seq.slot.index] = hint

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

    # ------------------------------------------------------------- each engine step
    def background(self, idle: bool) -> None:
        """Hold the pinned KV to its quota, free idle slots beyond the idle-cell limit while
        requests run, then store the next piece of parked copies (all of them when idle)."""
        self.enforce_pin_quota()
        if not idle and self.idle_cells is not None:
            self._offload_idle_slots()
        if self.parked is None or not self.parked.queue:
            return
        t0 = time.perf_counter()
        try:
            self.parked.drain() if idle else self.parked.advance()
        finally:
            ms = (time.perf_counter() - t0) * 1000.0
            self.clock.add(ms, step=not idle)
            self.write_back_ms += ms

    def enforce_pin_quota(self) -> None:
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
            reg.enforce_pinned_bytes(tree.nodes(), stored_bytes)
        h, d = tree.counters("H"), tree.counters("D")  # releases change only the epoch
        self._pin_signature = (reg.pin_epoch, tree.n_nodes, h.n_payloads, h.held_bytes, d.n_payloads, d.held_bytes)

    def _offload_idle_slots(self) -> None:
        """While requests run, idle slots keep at most `idle_cells` cells: under unified KV
        every kept cell is read (and masked out) by every running request's attention at every
        step, so a prefix nobody uses now costs all of them. The least recently used idle slots
        beyond the limit are written back (parked: stored piece by piece over the next steps)
        and freed; their next request restores from host instead of finding them in place."""
        assert self.idle_cells is not None  # called only with a limit
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
                self.write_back(slot, exclude=slot, park=True)
                self.runtime.seq_rm(slot.seq_id, -1, -1)
                slot.tokens = []
                self.slot_hints.pop(slot.index, None)
                self.idle_offloads += 1
        finally:
            self.clock.add((time.perf_counter() - t0) * 1000.0)


def stored_bytes(node) -> int:
    """The KV bytes a node's H and D values hold (what a pin keeps from being evicted there)."""
    return sum(node.values[t].nbytes for t in ("H", "D") if t in node.values)
