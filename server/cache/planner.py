"""Planning a request's prefix: the candidates each source offers, and the plan committed.

Pure: no llama.cpp, no runtime, no I/O of its own. It reads the radix tree (one walk for the
resident owners and the stored tiers on it), asks each stored tier's `lookup` (server/cache/tiers.py) and the
cost model's rates (server/cache/cost.py); the device copies other sequences hold (slots,
running requests, parked copies) are handed to it as (seq_id, tokens) pairs. So it is tested
over simulated payloads (tests/server/cache/test_planner.py), as SGLang tests its tree.

Contracts:
- `candidates(prompt, slot_common, live)`: one Candidate per enabled source, each at most
  len(prompt) - 1 tokens (the last prompt token is always computed, for its logits). A: the
  slot's own common prefix; S: the longest of the live copies and the resident owners (a live
  copy wins a tie); H, D: the tree walk (on a model with sliding-window or recurrent layers,
  cut back to the newest state checkpoint the host keeps on the path, which the candidate
  carries); R: asked only when it could beat every local source by a whole chunk (a network
  round trip), kept only when it does beat them.
- `plan(cands, prompt_len)`: the candidate to commit (None: compute everything) and the plan
  (route `cost`: lowest estimated time to first token; `longest`: the longest match; ties
  A > S > H > D > R). H, D and R are costed for what neither A nor S holds already; in the
  split KV layout (`copies`) for all of it, as they restore from position 0 into the emptied
  slot, and S is a copy between streams with its own cost (CostModel.copy_ms).
- `note(...)`: the counters /cache/stats shows (plans by label, shorter than the longest,
  the recent plans with their estimates).
- `defer_behind(seq, running, min_tokens)`: in-flight sharing, whether `seq` should wait for
  a running request computing a long prefix it shares.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any, cast

from server.cache.cost import CostModel, Plan, PlanOption
from server.cache.tiers import ON_TREE, STORED, KVTier, Source, tier_of
from server.engine.sequence import SeqStatus
from server.engine.slots import common_prefix_len

ROUTES = ("cost", "longest")


@dataclass(frozen=True)
class Candidate:
    source: Source
    length: int
    src_seq: int | None = None  # S: the sequence holding the cells
    owner: Any = None  # S: the resident owner (server.cache.resident.Owner), when it is one
    match: Any = None  # H, D, R: the tier's lookup (TierMatch, DiskMatch, SharedMatch), what its load reads
    # a model with sliding-window or recurrent layers: the state at `length` restored with it
    # (server/cache/checkpoints.py; A: None when cutting the slot back is enough)
    checkpoint: Any = None


def length_of(cands: list[Candidate], source: Source) -> int:
    return next((c.length for c in cands if c.source is source), 0)


def kept_in_slot(plan: Plan, a_len: int) -> int:
    """Tokens of the slot's own KV the plan keeps (the rest of the slot's KV is lost)."""
    n, source = plan.option.length, plan.option.source
    if source == Source.A:
        return n
    return min(a_len, n) if source in STORED else 0  # a stored tier restores after what the slot holds


class Planner:
    def __init__(self, *, enabled: set[Source], tree: Any, tiers: Iterable[KVTier], resident: Any,
                 route: str = "cost", costs: CostModel | None = None, checkpoints: Any = None,
                 copies: bool = False):
        """`enabled`: the sources in use (A and S among them); `tiers`: the stored tiers, ordered
        as server.cache.tiers.STORED; `copies`: the split KV layout (S copies a stream, a stored
        tier restores from position 0)."""
        self.copies = copies
        if route not in ROUTES:
            raise ValueError(f"unknown cache route {route!r}; choose among {', '.join(ROUTES)}")
        self.enabled = enabled
        self.tree = tree  # the one tree indexing the resident owners, H and D
        self.tiers = tuple(tiers)
        self.on_tree = [t for t in self.tiers if t.source in ON_TREE]  # they answer from the tree's walk
        self.shared = tier_of(self.tiers, Source.R)  # asked over the network, only when it may pay
        self.resident = resident  # ResidentOwners (take(walk) -> (length, owner)) or None
        # CheckpointStore, on a model with sliding-window or recurrent layers: a stored tier serves
        # only the longest prefix of its match that a state checkpoint is kept for
        self.checkpoints = checkpoints
        self.route = route
        self.costs = costs if costs is not None else CostModel()
        self.by_plan: dict[str, int] = {**{s.value: 0 for s in Source}, "compute": 0}
        self.shorter_than_longest = 0  # plans that left a longer match unused because it cost more
        self.recent_plans: deque[dict] = deque(maxlen=16)

    def candidates(self, prompt: Sequence[int], slot_common: int,
                   live: Iterable[tuple[int, Sequence[int]]] = ()) -> list[Candidate]:
        limit = len(prompt) - 1  # the last prompt token is always computed, for its logits
        out: list[Candidate] = []
        if Source.A in self.enabled:
            out.append(Candidate(Source.A, min(slot_common, limit)))
        rn, rowner, stored = 0, None, []
        if self.tree is not None:
            with self.tree.mutex:  # one walk for the resident owners, H and D
                m = self.tree.match_prefix(prompt[:limit])
                if self.resident is not None:
                    rn, rowner = self.resident.take(m)
                for tier in self.on_tree:
                    found = tier.lookup(cast(list[int], prompt[:limit]), m)  # the tiers read it, never change it
                    stored.append(self._stored(tier, prompt, found))
        if Source.S in self.enabled:
            n, src, owner = 0, None, None
            for seq_id, tokens in live:  # another sequence's device copy (the first longest)
                k = common_prefix_len(tokens, prompt)
                if k > n:
                    n, src = k, seq_id
            if rn > n:
                assert rowner is not None  # rn > 0: a resident owner holds the prefix
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

    def _stored(self, tier: Any, prompt: Sequence[int], found: Any) -> Candidate:
        """A stored tier's candidate; with checkpoints, cut back to the newest one it reaches."""
        if self.checkpoints is None or found.length == 0:
            return Candidate(tier.source, found.length, match=found)
        ckpt = self.checkpoints.best(prompt, found.length)
        if ckpt is None:
            return Candidate(tier.source, 0)
        if ckpt.pos < found.length:
            found = tier.lookup(prompt[:ckpt.pos])
        return Candidate(tier.source, found.length, match=found, checkpoint=ckpt)

    def plan(self, cands: list[Candidate], prompt_len: int) -> tuple[Candidate | None, Plan]:
        """The candidate to commit (None: compute everything) and the plan behind it."""
        # H, D and R restore only what neither the slot (A) nor a shared device copy (S) holds;
        # with state checkpoints, or a stream per slot (split), they restore everything (into the emptied slot)
        device = 0 if self.checkpoints is not None or self.copies else \
            max(length_of(cands, Source.A), length_of(cands, Source.S))
        options = [PlanOption(c.source.value, c.length, c.length - min(device, c.length) if c.source in STORED else 0,
                              copy=self.copies and c.source is Source.S)
                   for c in cands if c.length > 0]
        plan = self.costs.choose(options, prompt_len, longest=self.route == "longest")
        chosen = next((c for c in cands if c.source == plan.option.source), None)
        return chosen, plan

    def note(self, request_id: int, prompt_len: int, cands: list[Candidate], plan: Plan) -> None:
        self.by_plan[plan.label] += 1
        longest = max((c.length for c in cands), default=0)
        if plan.option.length < longest:
            self.shorter_than_longest += 1
        self.recent_plans.append({
            "request": request_id, "prompt_tokens": prompt_len, "plan": plan.label,
            "reused_tokens": plan.option.length, "est_ms": _ms(plan.est_ms),
            "candidates": {c.source: {"tokens": c.length, "est_ms": _ms(plan.estimates.get(c.source))}
                           for c in cands if c.length > 0},
            "compute_all_est_ms": _ms(plan.estimates.get("none")),
            **({"probe": True} if plan.probe else {}),
        })


def defer_behind(seq: Any, running: Iterable[Any], min_tokens: int) -> bool:
    """Whether `seq` should wait for a running request that is computing a long prefix it shares
    (or, for choices of one request, any prefix: they share their prompt however short)."""
    return deferring_to(seq, running, min_tokens) is not None


def deferring_to(seq: Any, running: Iterable[Any], min_tokens: int) -> tuple[Any, int] | None:
    """The running request `seq` should wait for (see `defer_behind`) and the prefix length it
    waits for, or None. A request of another cache namespace shares nothing with `seq`
    (server/engine/cache_namespace.py)."""
    namespace = getattr(seq.request, "cache_namespace", None)
    for other in running:
        if other.status is not SeqStatus.PREFILLING or getattr(other.request, "cache_namespace", None) != namespace:
            continue
        shared = common_prefix_len(other.prompt, seq.prompt)
        grouped = seq.request.prefill_group is not None and other.request.prefill_group is seq.request.prefill_group
        wanted = min(shared, len(seq.prompt) - 1)
        if (shared >= min_tokens or grouped) and other.n_past < wanted:
            return other, wanted
    return None


def _ms(x: float | None) -> float | None:
    return None if x is None else round(x, 3)
