"""When a device copy of KV is copied to host (and disk, and the shared store), and what a
finished request leaves on the device: the write-back policy beside server/cache/write_back.py
(which stores a parked copy piece by piece).

Contracts:
- Write-back, never write-through: a slot's kept KV (A) or a resident owner's (S) is stored
  only when it is about to be lost (the slot taken for another prefix, an owner evicted, an
  idle slot dropped for room or beyond the idle-cell limit), only what the host (and below
  it, disk and shared store) lacks, and not at all when another slot or owner still holds all
  its tokens, or when it is shorter than `min_tokens`. The stored tiers are one ordered
  collection (`tiers`, server/cache/tiers.py): the first reads the device, each one below
  stores from the first's copy (`store`).
- Only KV that is likely to be reused is written back (`ReuseGate`, issue 36: prompts that
  share nothing made every cache configuration slower than `--no-cache`). A resident owner's
  KV is always stored (it is resident because requests reused it). A slot's kept KV whose
  *novel* part (beyond what the tree or another device copy holds) is at least `min_tokens`
  long is stored when one of these holds, the first one naming the reason:
    `pinned`      its last request's session is pinned;
    `continues`   that session's latest state is `active` or `tool_wait` (the client says the
                  conversation goes on: a hint without a state is `active`);
    `recent_reuse` fewer than `streak` (default 4) slot copies were lost since the last
                  *comeback*: a prompt that extended a lost copy by `min_tokens` or more
                  beyond what was held when it was lost, whether that copy was stored or not;
    `cold_start`  no comeback yet and fewer than `streak` copies lost since start: a fresh
                  server stores its first losses as before the gate. (Not even a session of
                  one request that said `done` is skipped then: requests of other sessions
                  may share its prefix, as the shared_prefix workload's groups do, and the
                  benchmark replay's `--same-prompts` hints say `done` on every request.)
  Otherwise it is skipped: counted in `write_backs_skipped`, and its key kept (the novel
  part's first `min_tokens` tokens and a hash of what precedes them, at most 64 keys) so a
  later comeback is seen (`missed`: comebacks of skipped copies, reuse the gate cost). So
  a workload that never comes back to what it loses stops paying for stores after `streak`
  losses, and one that does keeps every store, learning again at its first comeback. Like
  SGLang's hierarchical cache (which writes through only after `write_through_threshold`
  hits), it stores on evidence of reuse; the evidence here is the workload's, since a lost
  slot copy has not been hit yet.
  `drop_device_copies` is not gated (its callers ask for all of it).
- A slot taken while other requests decode is parked (`park=True`, when parking is on) and
  stored a bounded piece per engine step (`background`); otherwise it is stored at once.
  A copy that fits in what is left of this step's budget (`step_bytes`, less what was stored
  at once in this step) is stored at once even then: parking it would cost the same store a
  step later, and its cells, held meanwhile, would push the new prompt elsewhere in the KV,
  leaving a hole that later prompts fill in pieces. Scattered sequences make paged attention
  visit more partly used KV tiles (issue 36: on the compute-light synthetic model, the unique
  workload's llama_decode calls replayed on one thread took 1.10x the CPU time of
  `--no-cache`'s with the four cold-start copies parked, 1.015x stored at once).
  A stored slot's path is tagged with the session of the hint its last request carried
  (`slot_hints`: a slot's kept KV outlives its request and its lease).
- `finished(seq, hint)`: a completed request's common prefix (what it reused, or what an idle
  slot still holds; all of it when pinned) is published as resident (tier S), its hint
  recorded on the deepest tree node it reached.
- `background(idle)`, once per engine step: the pinned-bytes quota (walked only when a pin
  or the tree's H/D contents changed), the idle-cell limit, the next parked pieces.
- `background(idle)` costs a few attribute reads when there is nothing to do (no pin, no
  idle-cell limit, nothing parked): it runs after every engine step.
- Counters: `write_backs`, `write_backs_skipped`, `write_back_ms`, `idle_offloads`,
  `store_errors`, the gate's (`ReuseGate.stats`); cache time on the engine thread goes to the
  shared EngineTime.
"""

from __future__ import annotations

import logging
import time
from collections import Counter, OrderedDict
from collections.abc import Callable, Iterable
from collections.abc import Sequence as Tokens
from dataclasses import dataclass
from typing import Any

from server.cache.engine_time import EngineTime
from server.cache.kv_format import KVSegment
from server.cache.kv_ops import ExtractError, KVOps
from server.cache.lifecycle import CacheHint, SessionRegistry
from server.cache.path_kv import DeviceKV, no_checkpoints
from server.cache.radix_node import RadixNode
from server.cache.radix_tree import RadixTree
from server.cache.resident import ResidentOwners
from server.cache.slot_paths import slot_paths
from server.cache.tiers import STORED_ON_TREE, KVTier, Source, tier_of
from server.cache.write_back import WriteBackQueue
from server.engine.llama_runtime import LlamaRuntime
from server.engine.sequence import Sequence
from server.engine.slots import Slot, SlotPool, common_prefix_len

log = logging.getLogger(__name__)

STORE_REASONS = ("pinned", "continues", "recent_reuse", "cold_start")


@dataclass
class _Lost:
    """A slot copy lost (stored or skipped), by the key a comeback would show."""

    prefix_hash: int  # hash of the tokens before the novel part
    stored: bool


class ReuseGate:
    """Whether a slot's kept KV about to be lost is likely to be reused (the rule is in the
    module docstring). Pure: tokens and hints in, a reason (or None: skip) out; no llama.cpp."""

    def __init__(self, min_tokens: int, streak: int = 4, max_keys: int = 64):
        self.min_tokens = max(1, min_tokens)  # tokens of the novel part a key holds
        self.streak = streak
        self.max_keys = max_keys
        self._lost: OrderedDict[tuple[int, tuple[int, ...]], _Lost] = OrderedDict()  # oldest first
        self._starts: Counter[int] = Counter()  # where the keys' novel parts start
        self.losses = 0  # slot copies lost with a novel part (gated)
        self.since_comeback = 0  # losses since the last comeback
        self.comebacks = 0  # prompts that extended a lost copy beyond what was held when it was lost
        self.missed = 0  # of which the copy had been skipped: reuse the gate cost
        self.skipped = 0
        self.reasons: Counter[str] = Counter({r: 0 for r in STORE_REASONS})

    def decide(self, tokens: Tokens[int], known: int, *, pinned: bool = False, continues: bool = False) -> str | None:
        """A slot copy of `tokens` is about to be lost; `known` leading tokens are held elsewhere
        (the tree, another device copy); `pinned`, `continues`: what its session's hints say.
        The reason to store it, or None to skip it."""
        if len(tokens) - known < self.min_tokens:
            return "small"  # no novel part worth a key: stored as before (host lacks what S holds)
        reason: str | None = None
        if pinned:
            reason = "pinned"
        elif continues:
            reason = "continues"
        elif self.since_comeback < self.streak:
            reason = "recent_reuse" if self.comebacks else "cold_start"
        self.losses += 1
        self.since_comeback += 1
        if reason is None:
            self.skipped += 1
        else:
            self.reasons[reason] += 1
        key = (known, tuple(tokens[known:known + self.min_tokens]))
        if key in self._lost:
            self._forget(key)
        self._lost[key] = _Lost(hash(tuple(tokens[:known])), reason is not None)
        self._starts[known] += 1
        while len(self._lost) > self.max_keys:
            self._forget(next(iter(self._lost)))
        return reason

    def admitted(self, prompt: Tokens[int]) -> None:
        """A prompt is admitted: a lost copy it extends by `min_tokens` beyond what was held
        when it was lost is a comeback (one key look-up per distinct start, a hash on a hit)."""
        if not self._lost:
            return
        for start in tuple(self._starts):
            end = start + self.min_tokens
            if end > len(prompt):
                continue
            key = (start, tuple(prompt[start:end]))
            lost = self._lost.get(key)
            if lost is None or lost.prefix_hash != hash(tuple(prompt[:start])):
                continue
            self._forget(key)
            self.comebacks += 1
            self.since_comeback = 0
            if not lost.stored:
                self.missed += 1

    def _forget(self, key: tuple[int, tuple[int, ...]]) -> None:
        del self._lost[key]
        self._starts[key[0]] -= 1
        if not self._starts[key[0]]:
            del self._starts[key[0]]

    def stats(self) -> dict:
        return {"losses": self.losses, "stored_by_reason": dict(self.reasons), "skipped": self.skipped,
                "comebacks": self.comebacks, "missed": self.missed, "since_comeback": self.since_comeback,
                "streak": self.streak}


class WriteBackPolicy:
    def __init__(self, *, runtime: LlamaRuntime, kv: KVOps, slots: SlotPool, running: Callable[[], list[Sequence]],
                 tree: RadixTree | None, tiers: Iterable[KVTier], registry: SessionRegistry, min_tokens: int,
                 resident_cells: int | None, step_bytes: int, idle_cells: int | None, clock: EngineTime,
                 copies: bool = False, beside: bool = True):
        """`tiers`: the stored tiers, ordered as server.cache.tiers.STORED (the first is written
        from the device, the ones below it from the first). `copies`: the split KV layout, where a
        resident owner holds a copy of its prefix in a stream of its own. `beside`: parked copies are
        read beside the compute where the KV allows it (server/cache/write_back.py), else in pieces."""
        self.runtime, self.kv, self.slots, self.running = runtime, kv, slots, running
        self.tree, self.tiers = tree, tuple(tiers)
        # the host tier, where a parked copy's path grows piece by piece and the KV size is learnt
        host = self.host = tier_of(self.tiers, Source.H)
        self.registry, self.min_tokens, self.clock = registry, min_tokens, clock
        # Resident owners (tier S, when `resident_cells` is given) write back through this policy.
        self.resident: ResidentOwners | None = None
        if resident_cells is not None:
            assert tree is not None  # S is indexed in the tree
            self.resident = ResidentOwners(tree, runtime, kv.seq_ids, resident_cells, registry,
                                           on_evict=self.write_back_owner, partial_state=kv.partial_state,
                                           copies=copies)
        # Parking needs the host tier (a stored path grows piece by piece there) and parked ids.
        self.parked: WriteBackQueue | None = None
        if host is not None and step_bytes > 0 and kv.seq_ids.layout.parked:
            reads = beside and kv.stages  # parked copies read out beside the compute, not stored in pieces
            self.parked = WriteBackQueue(runtime, kv.seq_ids, self.store, lambda: host.bytes_per_token, step_bytes,
                                         kv=kv if reads else None, held_depth=host.held_depth if reads else None,
                                         admits=host.admits if reads else None)
        # slot index -> the cache hint of its last request: the slot's kept KV (tier A) outlives
        # the request and its lease, and is written back later under that hint
        self.slot_hints: dict[int, CacheHint] = {}
        self.idle_cells = idle_cells  # cells idle slots may keep while requests run (None: no limit)
        self.idle_offloads = 0  # idle slots written back and freed for that limit
        self.gate = ReuseGate(min_tokens)
        self.write_backs = 0
        self.write_backs_skipped = 0  # slot copies lost unstored: nothing was likely to reuse them
        self.write_back_ms = 0.0
        self._step_bytes_stored = 0  # bytes of parkable copies stored at once in this engine step
        self.store_errors = 0
        self._pin_signature: tuple | None = None  # what the pinned-bytes quota last looked at
        # a model with sliding-window or recurrent layers: called with a slot whose KV is being
        # written back, to keep its state checkpoints (server/cache/checkpointed_slots.py)
        self.hand_over: Callable[[Slot], None] | None = None
        # ... and with a resident owner's sequence (its id and tokens) before it is written back
        self.hand_over_owner: Callable[[int, list[int]], None] | None = None
        # ... and how far a finished slot's state can be had, and with which checkpoint
        # (SlotStates.resumable): what a resident owner published from it can start from
        self.state_of: Callable[..., tuple[int, Any]] | None = None
        # ... and the checkpoints kept for a path at the shared store's chunk boundaries
        self.path_checkpoints: Callable[[list[int], int], list] | None = None

    # ------------------------------------------------------------ device copies lost
    def write_back(self, slot, exclude=None, park: bool = False, gated: bool = True) -> None:
        """The slot's kept KV is about to be lost: store what host/disk lack of it, now or
        (`park`, when parking is on) piece by piece over the next engine steps, if the gate
        finds it likely to be reused (`gated`)."""
        tokens = list(slot.tokens)
        if len(tokens) < self.min_tokens:
            return
        held = self.device_depth(tokens, exclude)
        if held == len(tokens):
            return
        hint = self.slot_hints.pop(slot.index, None)
        if gated and self.tiers and self.gate.decide(
                tokens, max(held, self._tree_depth(tokens)), pinned=self._pinned(hint),
                continues=self._state(hint) in ("active", "tool_wait")) is None:
            self.write_backs_skipped += 1
            return

        if self.hand_over is not None:  # the slot's state checkpoints go with its KV
            self.hand_over(slot)

        # the stored path is tagged with the session of the slot's last request as it is inserted
        sessions = (hint.session,) if hint is not None and hint.session else ()
        if park and self.parked is not None:
            nbytes = len(tokens) * self._kv_bytes_per_token(slot.seq_id, len(tokens))  # at most what is stored
            if nbytes <= self.parked.step_bytes - self._step_bytes_stored:
                self._step_bytes_stored += nbytes  # within this step's budget: now, in the cells it frees
            elif self.parked.park(slot.seq_id, tokens, sessions):
                self.write_backs += 1  # its time is counted piece by piece in `background`
                return
        self._timed_store(slot.seq_id, tokens, sessions)

    def _tagger(self, sessions: tuple[str, ...]) -> Callable[[RadixNode], None] | None:
        """PathKV.tag for a path the `sessions` use (None: no session): called with the stored path's tip under the
        tree's lock, as soon as a tier inserts it."""
        if not sessions:
            return None

        def tag(tip: RadixNode) -> None:
            for session in sessions:
                self.registry.tag(session, tip)
        return tag

    def _kv_bytes_per_token(self, seq_id: int, n_tokens: int) -> int:
        """The host's KV bytes per token, or before its first store, `seq_id`'s state size over
        its `n_tokens` tokens (llama.cpp sizes the state without copying it)."""
        if self.host is not None and self.host.bytes_per_token:
            return self.host.bytes_per_token
        return -(-self.runtime.state_seq_size(seq_id) // max(1, n_tokens))

    def drop_idle_slot(self, slot, gated: bool = True) -> None:
        """Free an idle slot's KV (e.g. for room), copying it to host/disk first if no
        other device copy holds it (and, `gated`, the gate finds it likely to be reused)."""
        if slot.busy:
            raise ValueError(f"slot {slot.index} is running a request")
        self.write_back(slot, exclude=slot, gated=gated)
        self.runtime.seq_rm(slot.seq_id, -1, -1)
        slot.tokens = []

    def drop_device_copies(self) -> None:
        """Drop every idle slot's KV and every resident owner, writing back first what
        host/disk lack (what a KV shortage would do to all of them; tests, benchmarks)."""
        if self.parked is not None:
            self.parked.drain()
        for slot in self.slots.slots:
            if not slot.busy:
                self.drop_idle_slot(slot, gated=False)
        if self.resident is not None:
            for owner in list(self.resident.owners):
                self.write_back_owner(owner.seq_id, owner.tokens, owner.sessions)
            self.resident.flush()

    def write_back_owner(self, seq_id: int, tokens: list[int], sessions: Iterable[str] = ()) -> None:
        """A resident owner is being evicted (its cells may be freed); `sessions`: those that used it (the stored
        path is tagged with them)."""
        if len(tokens) >= self.min_tokens and not self.held_on_device(tokens, None, owner_seq=seq_id):
            if self.hand_over_owner is not None:  # the owner's state at its end goes with its KV
                self.hand_over_owner(seq_id, tokens)
            self._timed_store(seq_id, tokens, tuple(sorted(sessions)))

    def held_on_device(self, tokens: list[int], exclude, owner_seq: int | None = None) -> bool:
        """Another slot (idle, or running over these tokens) or resident owner holds them all."""
        return self.device_depth(tokens, exclude, owner_seq) == len(tokens)

    def device_depth(self, tokens: list[int], exclude, owner_seq: int | None = None) -> int:
        """Leading tokens another slot (idle, or running over them) or a resident owner holds."""
        depth = 0
        for slot, held in slot_paths(self.slots, self.running()):
            if slot is exclude:
                continue
            depth = max(depth, common_prefix_len(held, tokens))
            if depth == len(tokens):
                return depth
        if self.resident is not None:
            depth = max(depth, self.resident.best(tokens, owner_seq)[0])
        return depth

    def _tree_depth(self, tokens: list[int]) -> int:
        """Leading tokens the tree holds in any tier (S, H, D)."""
        if self.tree is None:
            return 0
        with self.tree.mutex:
            return self.tree.match_prefix(tokens, touch=False).longest

    def _pinned(self, hint: CacheHint | None) -> bool:
        return hint is not None and (bool(hint.pin) or (hint.pin is None and hint.session is not None
                                                        and self.registry.is_pinned(hint.session)))

    def _state(self, hint: CacheHint | None) -> str | None:
        """The session's latest state (a later bare hint may have changed it); None without one."""
        if hint is None or hint.session is None:
            return None
        return self.registry.state(hint.session) or hint.state or "active"

    def admitted(self, prompt: list[int]) -> None:
        """A prompt is admitted (the router, before it plans): the gate looks for a comeback."""
        self.gate.admitted(prompt)

    def _timed_store(self, seq_id: int, tokens: list[int], sessions: tuple[str, ...] = ()):
        if not self.tiers:
            return None  # nowhere to write back to (e.g. tiers A,S)
        t0 = time.perf_counter()
        try:
            return self.store(seq_id, tokens, sessions=sessions)
        finally:
            self.write_backs += 1
            self.write_back_ms += (time.perf_counter() - t0) * 1000.0

    def store(self, slot_seq: int, tokens: list[int], to_disk: bool = True, ready: KVSegment | None = None,
              sessions: tuple[str, ...] = ()):
        """Store what the first tier (H, or D without it) lacks of `tokens`, read from
        `slot_seq` (or from `ready`, a segment of it read beforehand, where it covers the range),
        then, with `to_disk`, what each tier below it lacks, from the first tier's copy; the path
        is tagged with the `sessions` that use it as each tier inserts it, and ranked by them
        (PathKV.tag, PathKV.sessions). Returns the first tier's path tip (None: declined, or off
        the tree)."""
        if not self.tiers:
            return None
        first, *below = self.tiers
        path_checkpoints = self.path_checkpoints
        checkpoints = no_checkpoints if path_checkpoints is None else lambda align: path_checkpoints(tokens, align)

        def read(s: int, e: int) -> KVSegment:
            if ready is not None and ready.pos0 <= s and e <= ready.pos0 + ready.n_tokens:
                whole = (s, e) == (ready.pos0, ready.pos0 + ready.n_tokens)
                # a part (the first tier gained some of it since the read began): copied, so it does not keep
                # the whole read alive
                return ready if whole else ready.slice(s - ready.pos0, e - ready.pos0).compact()
            return self.kv.extract(slot_seq, s, e)
        try:
            held = first.store(tokens, DeviceKV(read, checkpoints, self._tagger(sessions), sessions))
            if held is None:
                return None
            if to_disk:
                for tier in below:  # each queues for its writer
                    tier.store(tokens, held)
            return held.tip
        except ExtractError as exc:
            self.store_errors += 1
            log.warning("could not store the request's KV: %s", exc)
        return None

    # ------------------------------------------------------------- finished requests
    def finished(self, seq: Sequence, hint, shared: int = 0) -> None:
        """`shared`: a prefix the request is known to share with earlier work (its branch point)."""
        tokens = seq.kv_tokens()
        if len(tokens) >= self.min_tokens:
            self._publish(seq, tokens, hint, shared)
        if hint is not None:
            self._observe_hint(hint, tokens)
            self.slot_hints[seq.slot.index] = hint

    # A tool wait's whole path is kept resident (set with a policy that reads the hints: server/cache/policy_events.py)
    keep_tool_waits = False

    def _publish(self, seq: Sequence, tokens: list[int], hint, shared: int = 0) -> None:
        """Keep the request's common prefix resident: the part it shared with earlier work
        (what it reused, what another slot still holds, its branch point), or all of it when pinned."""
        if self.resident is None:
            return
        common = max(seq.n_cached, shared)
        for slot in self.slots.slots:
            if slot is not seq.slot and not slot.busy:
                common = max(common, common_prefix_len(slot.tokens, tokens))
        if hint is not None and (hint.pin or (hint.pin is None and hint.session is not None
                                              and self.registry.is_pinned(hint.session))):
            common = len(tokens)  # pinned by this request or by an earlier hint (POST /cache/hint)
        elif self.keep_tool_waits and hint is not None and hint.state == "tool_wait" and hint.session is not None:
            # the session comes back after its tools: its whole path stays on the device (a seq_cp, no copy),
            # where the policy ranks it among the owners by its expected return
            common = len(tokens)
        checkpoint = None
        if self.state_of is not None and common > 0:
            # a model with sliding-window or recurrent layers: the owner needs the state after
            # exactly its tokens, from a cut of the slot or the newest checkpoint before `common`
            common, checkpoint = self.state_of(seq.slot, tokens, min(common, len(tokens)), held=len(tokens))
        if common >= self.min_tokens:
            self.resident.publish(tokens[:common], seq.slot.seq_id, hint, checkpoint=checkpoint)

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
        stored_at_once, self._step_bytes_stored = self._step_bytes_stored, 0  # the next step has a new budget
        if self.parked is None or not self.parked.queue:
            return
        t0 = time.perf_counter()
        try:
            self.parked.drain() if idle else self.parked.advance(self.parked.step_bytes - stored_at_once)
        finally:
            ms = (time.perf_counter() - t0) * 1000.0
            self.clock.add(ms, step=not idle, kind="write_back")
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
        if pin_signature(reg, tree) == self._pin_signature:
            return
        with tree.mutex:
            reg.enforce_pinned_bytes(tree.nodes(), stored_bytes)
        self._pin_signature = pin_signature(reg, tree)  # releases change only the epoch

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
            self.clock.add((time.perf_counter() - t0) * 1000.0, kind="write_back")


def pin_signature(registry: SessionRegistry, tree: RadixTree) -> tuple:
    """What the pinned bytes depend on: the pins, the nodes, each stored tier's values on the tree."""
    stored = tuple((c.n_payloads, c.held_bytes) for c in map(tree.counters, STORED_ON_TREE))
    return (registry.pin_epoch, tree.n_nodes, stored)


def stored_bytes(node) -> int:
    """The KV bytes a node's H and D values hold (what a pin keeps from being evicted there)."""
    return sum(node.values[t].nbytes for t in STORED_ON_TREE if t in node.values)
