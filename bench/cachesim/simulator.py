"""The cache simulator: one trace, one schedule, one policy, tier budgets -> computed prompt tokens.

What it runs of Arbor's own code: the radix tree (server/cache/radix_tree.py) with its per-tier
values, locks and eviction queue, the byte budgets (budget.py), the session registry's tags
(lifecycle.py), and the policies themselves: `lru` (eviction.LRUPolicy), `lifecycle`
(eviction.LifecyclePolicy, the hint classes: today's default), `predictive`
(predictive_policy.PredictivePolicy over lifecycle_model.LifecycleModel, fed the same events the
server feeds it), and `belady` (belady.py, the bound). What it models instead of running it
(llama.cpp, the engine and the router need a model):

- the device is a value tier "S" on the tree: a running request holds its prompt there (locked),
  and what finished requests leave stays within `device_cells` cells, evicted by the policy. In
  the server a slot keeps its last request's KV only until the next request takes the slot (at
  once when as many requests run as there are slots) and resident owners keep common prefixes in
  --resident-cells (2048): so `device_cells` defaults to that, the cells that outlive a request.
- an admitted prompt reuses the longest prefix the tiers hold together (device first, then H,
  then D, as the server's restore attaches what the device holds and copies the rest); it
  computes the rest, at least its last token;
- a device value evicted is written back to H (and D) unless H holds it already (write-back,
  never write-through, as server/cache/write_back_policy.py; Bélády stores only what is used
  again); H and D evict by the policy within their byte budgets, and under the predictive policy H
  admits a range by value as the server's host tier does (`admitted`: room only from what ranks
  below it, else declined with nothing evicted);
- every tier is ordered by the same policy, as the server's tiers share one.

Restores and prefetches do not change computed tokens: a prefix in H is reused whether it was
brought up before or at admission. The counts of tokens restored at admission per tier say what
prefetch could move off the critical path.
"""

from __future__ import annotations

import itertools
import math
from collections import Counter
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

from bench.cachesim.belady import BeladyPolicy, NextUse
from bench.cachesim.prefetch import Prefetcher
from bench.cachesim.schedule import ARRIVE, Event, arrival_order
from bench.cachesim.trace import Trace
from server.cache.budget import ByteBudget, enforce_budget
from server.cache.eviction import EvictionPolicy, LifecyclePolicy, LRUPolicy
from server.cache.lifecycle import CacheHint, SessionRegistry
from server.cache.lifecycle_model import Counts, LifecycleModel, ModelParams
from server.cache.predictive_policy import PredictivePolicy
from server.cache.radix_tree import RadixNode, RadixTree

DEVICE, HOST, DISK = "S", "H", "D"
TIERS = (DEVICE, HOST, DISK)
POLICIES = ("lru", "lifecycle", "predictive", "belady")
# the embedded model's (SmolLM2-135M) f16 KV: 30 layers x (K + V) x 192 x 2 bytes
EMBEDDED_BYTES_PER_TOKEN = 30 * 2 * 192 * 2


@dataclass(frozen=True)
class Budgets:
    device_cells: int = 2048  # device cells kept beyond running requests (--resident-cells)
    host_bytes: int = 64 << 20
    disk_bytes: int = 0
    bytes_per_token: int = EMBEDDED_BYTES_PER_TOKEN
    min_tokens: int = 32  # --cache-min-tokens: a shorter value is not written back


@dataclass(frozen=True)
class SimPayload:
    """A value's size only: the simulator has no KV."""

    n_tokens: int
    bytes_per_token: int

    @property
    def nbytes(self) -> int:
        return self.n_tokens * self.bytes_per_token

    def split(self, offset: int) -> tuple[SimPayload, SimPayload]:
        return SimPayload(offset, self.bytes_per_token), SimPayload(self.n_tokens - offset, self.bytes_per_token)


@dataclass
class SimResult:
    policy: str
    requests: int = 0
    prompt_tokens: int = 0
    computed: int = 0
    ideal: int = 0
    reused_by_tier: Counter = field(default_factory=Counter)  # reused tokens by the tier they came from
    write_backs: int = 0
    written_back_tokens: int = 0
    evicted_tokens: Counter = field(default_factory=Counter)
    declined: Counter = field(default_factory=Counter)  # write-backs a tier did not take (by value)
    per_request: list[int] = field(default_factory=list)  # computed tokens, manifest order
    prefetch: dict[str, int] | None = None  # tokens prefetched, then used (hits) or evicted unused (misses)
    predictor: dict[str, Any] | None = None

    def to_dict(self) -> dict[str, Any]:
        out = asdict(self)
        out["reused_by_tier"] = dict(self.reused_by_tier)
        out["evicted_tokens"] = dict(self.evicted_tokens)
        out["declined"] = dict(self.declined)
        out["computed_over_ideal"] = round(self.computed / self.ideal, 4) if self.ideal else None
        return out


def _path(node: RadixNode) -> tuple[int, ...]:
    return tuple(itertools.chain.from_iterable(reversed([n.key for n in node.iter_up()])))


class Simulator:
    def __init__(self, trace: Trace, events: Sequence[Event], budgets: Budgets, policy: str,
                 params: ModelParams | None = None, priors: Counts | None = None, prefetch: bool = False) -> None:
        """`prefetch` (the predictive policy only): bring waiting sessions' paths up to the device
        before their predicted return (prefetch.py)."""
        if policy not in POLICIES:
            raise ValueError(f"unknown policy {policy!r}; choose among {', '.join(POLICIES)}")
        self.trace, self.events, self.budgets, self.policy_name = trace, list(events), budgets, policy
        self.now = 0.0
        self.tree = RadixTree()
        self.registry = SessionRegistry(clock=lambda: self.now, max_done=1 << 20)
        self.model: LifecycleModel | None = None
        self.predictive: PredictivePolicy | None = None
        self.policy: EvictionPolicy = LRUPolicy()
        if policy == "lifecycle":
            self.policy = LifecyclePolicy(self.registry)
        elif policy == "predictive":
            self.model = LifecycleModel(params, priors, clock=lambda: self.now)
            self.policy = self.predictive = PredictivePolicy(self.model, self.registry)
        self.oracle: NextUse | None = None
        if policy == "belady":
            self.oracle = NextUse([r.tokens for r in trace.requests], arrival_order(self.events))
        self.prefetcher = Prefetcher(self) if prefetch and self.predictive is not None else None
        self.position = -1  # arrivals seen, less one
        self.running: dict[int, RadixNode] = {}
        self.result = SimResult(policy, ideal=trace.ideal.ideal_computed_tokens)
        self.result.per_request = [0] * len(trace.requests)

    # ---------------------------------------------------------------- run
    def run(self) -> SimResult:
        for event in self.events:
            self.now = event.time
            if event.kind == ARRIVE:
                self.position += 1
                if self.oracle is not None:
                    self.policy = BeladyPolicy(self.oracle, self.position)
                self.arrive(event.index)
            else:
                self.end(event.index)
            if self.prefetcher is not None:
                self.prefetcher.run()
        if self.model is not None:
            self.result.predictor = self.model.summary()
        if self.prefetcher is not None:
            p = self.prefetcher
            self.result.prefetch = {"prefetched": p.prefetched, "hits": p.hits, "misses": p.misses}
        return self.result

    def factory(self, start: int, end: int) -> SimPayload:
        return SimPayload(end - start, self.budgets.bytes_per_token)

    def range_factory(self, start: int):
        """A payload for the range that starts at `start` only (the value written back)."""
        return lambda s, e: self.factory(s, e) if s == start else None

    def arrive(self, index: int) -> None:
        req = self.trace.requests[index]
        tokens = req.tokens
        m = self.tree.match_prefix(tokens)
        if self.predictive is not None:
            self.predictive.arrived(req.session, tokens)
        # the prefix the tiers hold together: each node from the device if it is there, else H, else D
        reused, by_tier = 0, Counter[str]()
        nodes = [(n, len(n.key)) for n in m.path]
        if m.partial_node is not None:
            nodes.append((m.partial_node, m.partial_tokens))
        for node, n in nodes:
            tier = next((t for t in TIERS if t in node.values), None)
            if tier is None:
                break
            if tier == DEVICE and self.prefetcher is not None:
                self.prefetcher.used(node)
            reused += n
            by_tier[tier] += n
        usable = min(reused, len(tokens) - 1)
        for tier in reversed(TIERS):  # the last token is computed: take it off the deepest tier used
            over = sum(by_tier.values()) - usable
            if over <= 0:
                break
            by_tier[tier] -= min(over, by_tier[tier])
        computed = len(tokens) - usable
        res = self.result
        res.requests += 1
        res.prompt_tokens += len(tokens)
        res.computed += computed
        res.per_request[index] = computed
        res.reused_by_tier.update({t: n for t, n in by_tier.items() if n})
        # the prompt goes to the device (held while it runs); what finished requests left there
        # gives way beyond the device's budget
        tip = self.tree.insert(tokens, DEVICE, self.factory).last_node
        self.tree.lock(tip)
        self.running[index] = tip
        self.make_room(DEVICE)

    def end(self, index: int) -> None:
        req = self.trace.requests[index]
        tip = self.running.pop(index)
        self.tree.unlock(tip)
        if tip.attached:
            self.registry.observe(CacheHint(req.session, req.hint), tip)  # type: ignore[arg-type]
        if self.predictive is not None:
            self.predictive.ended(req.session, req.hint, req.tokens, tool=req.tool)
        if self.prefetcher is not None:
            self.prefetcher.ended(req.session, req.tokens)

    # ------------------------------------------------------------ budgets
    def limit(self, tier: str) -> int:
        b = self.budgets
        if tier == DEVICE:  # running requests' cells, and the budget beyond them
            return b.device_cells * b.bytes_per_token + self.tree.tier(DEVICE).protected_bytes
        return b.host_bytes if tier == HOST else b.disk_bytes

    def make_room(self, tier: str) -> None:
        res = enforce_budget(self.tree, tier, ByteBudget(self.limit(tier)), self.policy)
        self.result.evicted_tokens[tier] += sum(v.n_tokens for _, v in res.freed)
        if tier == DEVICE and res.freed:
            if self.prefetcher is not None:
                for node, _ in res.freed:
                    self.prefetcher.evicted(node)
            self.write_back([node for node, _ in res.freed])

    def write_back(self, nodes: list[RadixNode]) -> None:
        """Device values evicted: store in H (and D) what they lack, ancestors first."""
        targets = [t for t in (HOST, DISK) if self.limit(t) > 0]
        if not targets:
            return
        stored: set[str] = set()
        for node in sorted(nodes, key=lambda n: n.start()):
            if node.start() + len(node.key) < self.budgets.min_tokens:
                continue  # a path shorter than --cache-min-tokens is not stored
            if isinstance(self.policy, BeladyPolicy) and not self.policy.worth_storing(node):
                continue
            path, start = _path(node), node.start()
            for tier in targets:
                if node.attached and tier in node.values:
                    continue
                if not self.admitted(tier, node):
                    self.result.declined[tier] += 1
                    continue
                got = self.tree.insert(path, tier, self.range_factory(start))
                # the sessions that passed through it go with the copy (the server tags a stored path
                # with its slot's session: write_back_policy.py)
                got.last_node.sessions |= node.sessions
                if got.last_node.attached and tier in got.last_node.values:
                    stored.add(tier)
                    self.result.write_backs += tier == HOST
                    self.result.written_back_tokens += len(node.key) if tier == HOST else 0
        for tier in (HOST, DISK):
            if tier in stored:
                res = enforce_budget(self.tree, tier, ByteBudget(self.limit(tier)), self.policy)
                self.result.evicted_tokens[tier] += sum(v.n_tokens for _, v in res.freed)

    def admitted(self, tier: str, node: RadixNode) -> bool:
        """Whether `tier` takes `node`'s range (evicting for it), as the server's host tier does (host_tier.py): under
        a policy that ranks a path by its sessions (predictive), it makes room only from what ranks below the node's
        sessions, and evicts nothing for a range that could not fit so. Other policies, and D (the server's disk tier
        admits every path): always (the budget is enforced after the write-back)."""
        rank = getattr(self.policy, "sessions_priority", None)
        if rank is None or tier != HOST:
            return True
        floor = rank(node.sessions, math.inf)
        if floor is None:
            return True
        need = len(node.key) * self.budgets.bytes_per_token
        budget = ByteBudget(self.limit(tier))
        over = budget.over_by(self.tree.tier(tier).held_bytes, need)
        if over and self.tree.evictable_below(tier, self.policy, floor) < over:
            return False
        res = enforce_budget(self.tree, tier, budget, self.policy, need, floor=floor)
        self.result.evicted_tokens[tier] += sum(v.n_tokens for _, v in res.freed)
        return res.satisfied


def simulate(trace: Trace, events: Sequence[Event], budgets: Budgets, policies: Sequence[str] = POLICIES,
             params: ModelParams | None = None, priors: Counts | None = None) -> dict[str, SimResult]:
    """Each policy on the same trace, events and budgets."""
    return {p: Simulator(trace, events, budgets, p, params, priors).run() for p in policies}
