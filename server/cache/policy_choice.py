"""`--cache-policy`: the eviction policy every tier shares, by name (seed 003's strategies).

- `lru` (seed 003's LRU): least recently used first (eviction.LRUPolicy);
- `lifecycle` (seed 003's QUEUE_WINDOW): the hints' classes, finished sessions first, tool waits
  last, LRU within a class (eviction.LifecyclePolicy);
- `predictive` (seed 003's BAYES_LIFECYCLE): the lifecycle model's expected reuse of each block
  (predictive_policy.PredictivePolicy over lifecycle_model.LifecycleModel), with the priors file
  when one is given.

Resident owners (tier S) are ranked by the same policy (`owner_rank`); the host and disk tiers
take the policy itself.
"""

from __future__ import annotations

from collections.abc import Callable, Hashable
from pathlib import Path
from typing import TYPE_CHECKING

from server.cache.eviction import EvictionPolicy, LifecyclePolicy, LRUPolicy
from server.cache.lifecycle import SessionRegistry
from server.cache.lifecycle_model import LifecycleModel, ModelParams
from server.cache.lifecycle_priors import load_priors
from server.cache.predictive_policy import PredictivePolicy

if TYPE_CHECKING:
    from server.cache.resident import Owner

POLICIES = ("lru", "lifecycle", "predictive")


def choose_policy(name: str, registry: SessionRegistry, params: ModelParams | None = None,
                  priors: Path | None = None) -> EvictionPolicy:
    """The policy `name` names; a priors file that cannot be read raises PriorsError."""
    if name == "lru":
        return LRUPolicy()
    if name == "lifecycle":
        return LifecyclePolicy(registry)
    if name == "predictive":
        counts = load_priors(priors) if priors is not None else None
        return PredictivePolicy(LifecycleModel(params, counts, max_sessions=registry.max_sessions), registry)
    raise ValueError(f"unknown cache policy {name!r}; choose among {', '.join(POLICIES)}")


def owner_rank(policy: EvictionPolicy) -> Callable[[Owner], Hashable | None] | None:
    """How resident owners are ranked under `policy` (None: their own lifecycle classes)."""
    if isinstance(policy, LRUPolicy):
        return lambda owner: (owner.last_used,)
    if isinstance(policy, PredictivePolicy):
        return lambda owner: policy.sessions_priority(owner.sessions, owner.last_used)
    return None
