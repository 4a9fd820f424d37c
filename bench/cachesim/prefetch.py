"""Prefetch in the simulator (issue 58, item 3; the server's, by the same rule, is
server/cache/prefetch.py): a waiting session whose predicted value is high has the part of its
path that only H or D holds brought up to the device before it calls again, as far as the
device's budget allows: into free cells, or in place of device copies of KV that H or D also
keeps and that are worth less than the session (so nothing is lost, only moved down a tier).

It changes what is restored when a request is admitted (on the critical path) more than what is
computed: a prefix in H is reused either way, but restored before the call it costs the request
nothing. Counted: tokens prefetched, prefetched tokens a request then used from the device (hits),
prefetched tokens evicted before any use (misses).
"""

from __future__ import annotations

from collections.abc import Hashable
from typing import TYPE_CHECKING

from server.cache.lifecycle_counts import WAITING

if TYPE_CHECKING:
    from bench.cachesim.simulator import Simulator
    from server.cache.eviction import EvictionPolicy
    from server.cache.radix_node import RadixNode

DEVICE, HOST, DISK = "S", "H", "D"


class _Below:
    """The policy, refusing nodes worth as much as `value` or more, and nodes whose KV the device
    alone holds: prefetch only trades a device copy of something H or D keeps for another."""

    name = "below"

    def __init__(self, policy: EvictionPolicy, value: float) -> None:
        self.policy, self.value = policy, value

    def priority(self, node: RadixNode) -> Hashable | None:
        if HOST not in node.values and DISK not in node.values:
            return None
        key = self.policy.priority(node)
        return key if isinstance(key, tuple) and key and key[0] < self.value else None


class Prefetcher:
    def __init__(self, sim: Simulator, min_value: float = 0.25) -> None:
        self.sim = sim
        self.min_value = min_value
        self.last: dict[str, tuple[int, ...]] = {}  # session -> the tokens of its last request
        self.pending: dict[RadixNode, int] = {}  # device values brought up and not used yet
        self.prefetched = self.hits = self.misses = 0

    def ended(self, session: str, tokens: tuple[int, ...]) -> None:
        self.last[session] = tokens

    def used(self, node: RadixNode) -> None:
        n = self.pending.pop(node, 0)
        self.hits += min(n, len(node.key))

    def evicted(self, node: RadixNode) -> None:
        n = self.pending.pop(node, 0)
        self.misses += min(n, len(node.key))

    def run(self) -> None:
        sim, model = self.sim, self.sim.model
        if model is None or sim.predictive is None:
            return
        waiting = [(model.session_value(s, sim.now), s) for s in self.last if model.state(s) in WAITING]
        for value, session in sorted(waiting, reverse=True):
            if value < self.min_value:
                break
            self._bring_up(session, value)

    def _bring_up(self, session: str, value: float) -> None:
        sim, tree = self.sim, self.sim.tree
        m = tree.match_prefix(self.last[session], touch=False)
        missing = []
        for node in m.path:
            if DEVICE in node.values:
                continue
            if HOST not in node.values and DISK not in node.values:
                break
            missing.append(node)
        if not missing:
            return
        bpt = sim.budgets.bytes_per_token
        need = sum(len(n.key) for n in missing) * bpt
        free = sim.limit(DEVICE) - tree.tier(DEVICE).held_bytes
        if need > free:
            for n in missing:
                tree.lock(n)  # what is brought up must not make room for itself, on the device or in H (the
            try:  # server locks the host path it restores from while the device's evicted paths are stored)
                res = tree.evict(need - free, DEVICE, _Below(sim.policy, value))
                for node, _ in res.freed:
                    self.evicted(node)
                sim.result.evicted_tokens[DEVICE] += res.freed_tokens
                if res.freed:
                    sim.write_back([node for node, _ in res.freed])
            finally:
                for n in missing:
                    tree.unlock(n)
            if not res.satisfied:
                return
        for node in missing:
            if not node.attached or DEVICE in node.values:
                continue
            start = node.start()
            tree.insert(self.last[session][:start + len(node.key)], DEVICE, sim.range_factory(start))
            if DEVICE in node.values:
                self.pending[node] = self.pending.get(node, 0) + len(node.key)
                self.prefetched += len(node.key)
