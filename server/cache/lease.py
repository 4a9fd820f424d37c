"""A request's hold on the cache, carried on the request itself (`Sequence.cache_lease`).

As nano-vllm's `Sequence` carries its own block table, a request carries what the cache knows
about it from the moment the router first sees it (a deferral, or admission) to its end:

- `hint`: the client's lifecycle hint (server/cache/lifecycle.py), or None;
- `plan`: the plan committed at admission (server/cache/cost.py), None before;
- `kept`: prompt tokens the slot already held when a read ahead started (D, R);
- `tip`: the radix node the lease holds a lock reference on while its KV is restored;
- `load`: the read ahead of the plan's disk or shared-store part, while the request waits
  (LOADING) for it;
- `overhead_s`: engine time the cache spent on the request (routing, restores, the wait for
  a read ahead), taken out of its prefill time when the prefill rate is measured;
- `deferred`: it waited at least once for another request computing a prefix it shares;
- `branch_point`: on a model with sliding-window or recurrent layers, how far the prompt
  followed a path the cache knew at admission (its prefill checkpoints the state there; what
  it publishes resident, when it finishes, reaches that far).

Contracts: `CacheRouter.provide` (or `should_defer`, whichever comes first) puts the lease on
the sequence; `CacheRouter.on_finished` releases it (`release`: any lock it still holds is
given back, a pending read is abandoned) and takes it off. No table of the router is keyed by
a request: what dies with the request dies with its lease.
"""

from __future__ import annotations

from collections import deque
from concurrent.futures import Future
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from server.cache.cost import Plan
    from server.cache.radix_node import RadixNode
    from server.cache.radix_tree import RadixTree


@dataclass(eq=False)
class PendingLoad:
    """A plan's disk (D) or shared-store (R) part being read on an I/O thread, or its host (H) part
    waiting to be restored in pieces or staged (server/cache/restore.py), and how far its restore got."""

    cand: Any  # the planner's Candidate (server/cache/planner.py: source, length, the tier's match)
    slot_seq: int  # the llama.cpp sequence the read KV is restored into
    future: Future  # phase "read": (segments, read seconds, state checkpoint or None); "join": (the joined state,
    # KVOps.joined, the join's seconds); "write": the staged write's seconds (server/cache/restore.py)
    started: float  # perf_counter() when the read was queued
    phase: str = "read"
    rest: deque | None = None  # the segments not restored yet (None: not taken from `future` yet)
    done: int = 0  # the slot's sequence holds positions [0, done)
    read_s: float = 0.0
    restore_s: float = 0.0
    nbytes: int = 0
    n_tokens: int = 0


@dataclass(eq=False)
class CacheLease:
    hint: Any = None  # server.cache.lifecycle.CacheHint
    plan: Plan | None = None
    kept: int = 0
    tip: RadixNode | None = None
    load: PendingLoad | None = None
    overhead_s: float = 0.0
    deferred: bool = False
    branch_point: int = 0

    def lock(self, tree: RadixTree, node: RadixNode | None) -> None:
        """Hold a lock reference on `node` (caller holds `tree.mutex`); one at a time."""
        assert self.tip is None, "a lease holds one lock at a time"
        if node is not None and node.attached and not node.is_root:
            tree.lock(node)
            self.tip = node

    def unlock(self, tree: RadixTree) -> None:
        """Give back the lock reference, if any (caller holds `tree.mutex`)."""
        tip, self.tip = self.tip, None
        if tip is not None and tip.attached:
            tree.unlock(tip)

    def release(self, tree: RadixTree | None) -> None:
        """The request ended: nothing of the cache is held for it any more."""
        if tree is not None and self.tip is not None:
            with tree.mutex:
                self.unlock(tree)
        self.load = None
