"""Per-tier byte budgets over the radix tree: how much to evict, and evicting it.

Apart from the policies (server/cache/eviction.py) because it drives the tree
(``RadixTree.evict``), which ranks by those policies.
"""

from __future__ import annotations

from collections.abc import Callable, Hashable
from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from server.cache.eviction import EvictionPolicy
    from server.cache.radix_tree import RadixTree


@dataclass(frozen=True)
class ByteBudget:
    """A byte limit for one tier; ``over_by`` says how much to evict to respect it."""

    limit_bytes: int

    def __post_init__(self) -> None:
        if self.limit_bytes < 0:
            raise ValueError(f"limit_bytes must be >= 0, got {self.limit_bytes}")

    def over_by(self, used_bytes: int, incoming_bytes: int = 0) -> int:
        """Bytes to free so that ``used + incoming`` fits (0 when it already does)."""
        return max(0, used_bytes + incoming_bytes - self.limit_bytes)


@dataclass(frozen=True)
class BudgetResult:
    """What ``enforce_budget`` evicted (node, value pairs in eviction order) and whether
    the tier now fits its budget with the incoming bytes."""

    freed: tuple
    freed_bytes: int
    satisfied: bool


def enforce_budget(
    tree: RadixTree,
    tier: str,
    budget: ByteBudget,
    policy: EvictionPolicy | None = None,
    incoming_bytes: int = 0,
    settle: Callable[[tuple], None] | None = None,
    floor: Hashable | None = None,
) -> BudgetResult:
    """Evict ``tier``'s values until what they keep alive plus ``incoming_bytes`` fits ``budget``.

    The tier is charged for its allocations, whole (``TierCounters.held_bytes``): a value
    that shares a buffer or a file with others frees nothing until the last of them goes,
    so eviction runs in rounds until the allocations fit; ``settle(freed)`` runs after each
    round (the host tier copies surviving slices out of mostly freed buffers). Only ``tier``'s values go (a node
    keeps what other tiers hold of it). Check ``satisfied``: locked or pinned nodes may
    leave the tier over budget, and the caller then declines to store the incoming payload.
    ``floor`` (a policy key): only values ranked below it go (RadixTree.evict), so an incoming
    payload worth less than what the tier holds is declined rather than let in.
    """
    counters = tree.tier(tier)
    freed: list = []
    freed_bytes = 0
    while True:
        over = budget.over_by(counters.held_bytes, incoming_bytes)
        if over == 0:
            return BudgetResult(tuple(freed), freed_bytes, True)
        res = tree.evict(over, tier, policy, floor)
        if not res.freed:
            return BudgetResult(tuple(freed), freed_bytes, False)
        freed.extend(res.freed)
        freed_bytes += res.freed_bytes
        if settle is not None:
            settle(res.freed)
