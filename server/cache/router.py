"""The prefix router: for each admitted request, the longest executable prefix among

- A: the slot's own kept KV,
- S: KV already in the unified cache under another sequence: a resident owner, or another
     slot (idle or running) whose computed tokens share the prefix; attached with seq_cp,
- H: segments in host RAM, restored,
- D: segment files on disk, restored,

policy `longest` with ties A > S > H > D, one path committed per request. Any failure while
attaching or restoring clears the slot's sequence and falls back to computing the prompt:
a cache may make a request faster, never wrong. After a request completes (never before),
its new segments are stored (increments only) and its common prefix may be published as
resident. Requests that arrive while another one is still computing a long common prefix
wait for it and then attach (in-flight sharing), instead of computing it twice.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass

from server.cache.disk_tier import DiskSegmentError, DiskTier
from server.cache.host_tier import HostTier, TierMatch
from server.cache.kv_format import KVSegment
from server.cache.kv_ops import ExtractError, KVOps, RestoreError
from server.cache.lifecycle import SessionRegistry
from server.cache.resident import ResidentOwners
from server.engine.llama_runtime import LlamaRuntime
from server.engine.scheduler import Admission
from server.engine.sequence import CacheReport, Sequence, SeqStatus
from server.engine.slots import SlotPool, common_prefix_len

log = logging.getLogger(__name__)
TIE_ORDER = {"A": 0, "S": 1, "H": 2, "D": 3}


@dataclass(frozen=True)
class Candidate:
    source: str
    length: int
    src_seq: int | None = None  # S: the sequence holding the cells
    owner: object | None = None  # S: the resident owner, when it is one
    host: TierMatch | None = None
    disk_nodes: list | None = None


class CacheRouter:
    def __init__(self, *, runtime: LlamaRuntime, kv: KVOps, slots: SlotPool, running: Callable[[], list[Sequence]],
                 tiers: set[str], host: HostTier | None, disk: DiskTier | None, resident: ResidentOwners | None,
                 registry: SessionRegistry, min_tokens: int):
        self.runtime = runtime
        self.kv = kv
        self.slots = slots
        self.running = running
        self.tiers = tiers
        self.host = host
        self.disk = disk
        self.resident = resident
        self.registry = registry
        self.min_tokens = min_tokens
        self.by_source: dict[str, int] = {k: 0 for k in ("A", "S", "H", "D", "none")}
        self.reused_tokens: dict[str, int] = {k: 0 for k in ("A", "S", "H", "D")}
        self.fallbacks = 0
        self.deferrals = 0
        self.store_errors = 0

    # -------------------------------------------------------------- choosing
    def candidates(self, adm: Admission) -> list[Candidate]:
        prompt = adm.seq.prompt
        limit = len(prompt) - 1  # the last prompt token is always computed, for its logits
        out: list[Candidate] = []
        if "A" in self.tiers:
            out.append(Candidate("A", min(adm.common_prefix, limit)))
        if "S" in self.tiers:
            n, src, owner = self._best_live(adm)
            if self.resident is not None:
                rn, rowner = self.resident.best(prompt)
                if rn > n:
                    n, src, owner = rn, rowner.seq_id, rowner
            out.append(Candidate("S", min(n, limit), src_seq=src, owner=owner))
        if self.host is not None:
            m = self.host.match(prompt[:limit])
            out.append(Candidate("H", m.length, host=m))
        if self.disk is not None:
            n, nodes = self.disk.match(prompt[:limit])
            out.append(Candidate("D", n, disk_nodes=nodes))
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
        return best, src, None

    @staticmethod
    def choose(cands: list[Candidate]) -> Candidate | None:
        useful = [c for c in cands if c.length > 0]
        if not useful:
            return None
        return max(useful, key=lambda c: (c.length, -TIE_ORDER[c.source]))

    # ------------------------------------------------------------- committing
    def provide(self, adm: Admission) -> CacheReport:
        cands = self.candidates(adm)
        best = self.choose(cands)
        a_len = next((c.length for c in cands if c.source == "A"), 0)
        slot_seq = adm.slot.seq_id
        if best is None:
            self.runtime.seq_rm(slot_seq, -1, -1)
            self.by_source["none"] += 1
            return CacheReport()
        try:
            report = self._commit(best, slot_seq, a_len)
        except (RestoreError, DiskSegmentError, ExtractError) as exc:
            log.warning("cache %s failed for request %d (%s); computing the prompt instead", best.source, adm.seq.id, exc)
            self.runtime.seq_rm(slot_seq, -1, -1)
            self.fallbacks += 1
            self.by_source["none"] += 1
            return CacheReport()
        self.by_source[best.source] += 1
        self.reused_tokens[best.source] += report.reused_tokens
        return report

    def _commit(self, c: Candidate, slot_seq: int, a_len: int) -> CacheReport:
        if c.source == "A":
            if not self.runtime.seq_rm(slot_seq, c.length, -1):
                raise RestoreError("could not trim the slot's KV")
            return CacheReport("A", c.length)
        if c.source == "S":
            # Drop the slot's own copy entirely: attaching shares the other sequence's cells,
            # so the slot's duplicates are freed (one physical copy of the prefix).
            self.runtime.seq_rm(slot_seq, -1, -1)
            self.runtime.seq_cp(c.src_seq, slot_seq, 0, c.length)
            if self.runtime.seq_pos_max(slot_seq) != c.length - 1:
                raise RestoreError("attaching the shared prefix did not give the expected cells")
            if c.owner is not None:
                self.resident.note_attach(c.owner)
            return CacheReport("S", c.length)
        # H or D: keep what the slot already holds (A) and restore only the rest.
        keep = min(a_len, c.length)
        if not self.runtime.seq_rm(slot_seq, keep, -1):
            self.runtime.seq_rm(slot_seq, -1, -1)
            keep = 0
        if c.source == "H":
            segments = c.host.segments
            self.host.hits += 1
        else:
            segments = self.disk.load(c.disk_nodes).segments
            self.disk.hits += 1
        need = _cut(segments, keep, c.length)
        result = self.kv.restore(need, slot_seq)
        return CacheReport(c.source, c.length, result.nbytes, result.ms)

    # ------------------------------------------------- in-flight sharing (defer)
    def should_defer(self, seq: Sequence) -> bool:
        """Wait for a running request that is computing a long prefix this one shares."""
        if "S" not in self.tiers:
            return False
        for other in self.running():
            if other.status is not SeqStatus.PREFILLING:
                continue
            shared = common_prefix_len(other.prompt, seq.prompt)
            if shared >= self.min_tokens and other.n_past < min(shared, len(seq.prompt) - 1):
                self.deferrals += 1
                return True
        return False

    # --------------------------------------------------------------- finishing
    def on_finished(self, seq: Sequence, reason: str) -> None:
        hint = seq.request.cache_hint
        if reason == "error" or seq.slot is None:
            return
        tokens = seq.kv_tokens()
        tip = None
        if len(tokens) >= self.min_tokens:
            tip = self._store(seq.slot.seq_id, tokens)
            self._publish(seq, tokens, hint)
        if hint is not None:
            self.registry.observe(hint, tip)

    def _store(self, slot_seq: int, tokens: list[int]):
        if self.host is None and self.disk is None:
            return None
        try:
            if self.host is not None:
                result = self.host.store(tokens, lambda s, e: self.kv.extract(slot_seq, s, e))
                if self.disk is not None and result.last_node.attached:
                    path = [n for n in result.last_node.iter_up()][::-1]
                    ranges = [(n.start(), n.payload) for n in path if n.payload is not None]
                    self.disk.store(tokens, ranges)
                return result.last_node if result.last_node.attached else None
            have, _ = self.disk.match(tokens)  # whole or partial: what is on disk already
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
        if hint is not None and hint.pin:
            common = len(tokens)
        if common >= self.min_tokens:
            self.resident.publish(tokens[:common], seq.slot.seq_id, hint)

    # ------------------------------------------------------------- operations
    def reclaim(self, slots: SlotPool) -> bool:
        """Free cells for running requests: idle slots' kept KV first (oldest first), then
        resident owners (lifecycle order). Pinned owners stay."""
        if slots.drop_oldest_idle(lambda slot: self.runtime.seq_rm(slot.seq_id, -1, -1)):
            return True
        return self.resident is not None and self.resident.evict_one()

    def flush(self) -> dict:
        freed = {}
        if self.host is not None:
            freed["H"] = self.host.flush()
        if self.disk is not None:
            freed["D"] = self.disk.flush()
        if self.resident is not None:
            freed["S_cells"] = self.resident.flush()
        return freed


def _cut(segments: list[KVSegment], start: int, end: int) -> list[KVSegment]:
    """The parts of consecutive path segments (from position 0) covering [start, end)."""
    out, pos = [], 0
    for seg in segments:
        s, e = pos, pos + seg.n_tokens
        pos = e
        if e <= start or s >= end:
            continue
        out.append(seg.slice(max(start, s) - s, min(end, e) - s))
    return out
