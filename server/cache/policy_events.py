"""What the router tells the cache policy and what the policy reports (/cache/stats `policy`).

The predictive policy's lifecycle model (server/cache/lifecycle_model.py) learns from what the
server sees: a request admitted (`arrived`: its session's call, and a branch fork when a new
session continues another's path), a request ended with its hint (`ended`), a bare hint
(`POST /cache/hint`, through the registry's `on_apply`). Every policy reports its name and the
prompt tokens its cache served (`hit_rate`: reused over prompt tokens of the requests ended).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from server.cache.eviction import EvictionPolicy
from server.cache.lifecycle import CacheHint, SessionRegistry
from server.cache.policy_choice import owner_rank
from server.cache.predictive_policy import PredictivePolicy
from server.cache.resident import ResidentOwners
from server.cache.write_back_policy import WriteBackPolicy


class PolicyEvents:
    def __init__(self, policy: EvictionPolicy, registry: SessionRegistry, resident: ResidentOwners | None,
                 write: WriteBackPolicy | None = None) -> None:
        """`write`: told to keep a tool wait's whole path resident when the policy reads the hints (not LRU:
        recency alone would keep it no better than any other prefix)."""
        if write is not None:
            write.keep_tool_waits = policy.name != "lru"
        self.policy = policy
        self.predictive = policy if isinstance(policy, PredictivePolicy) else None
        rank = owner_rank(policy)
        if resident is not None and rank is not None:
            resident.rank = rank  # owners go in the policy's order too
        if self.predictive is not None:
            predictive = self.predictive
            registry.on_apply = lambda hint: predictive.hinted(hint.session, hint.state, hint.tool)
        self.requests = 0
        self.prompt_tokens = 0
        self.reused_tokens = 0

    def arrived(self, hint: CacheHint | None, prompt: Sequence[int]) -> None:
        """A request is admitted with `prompt` (its cache key)."""
        if self.predictive is not None:
            self.predictive.arrived(hint.session if hint is not None else None, prompt)

    def ended(self, hint: CacheHint | None, prompt_tokens: int, reused: int, kv_tokens: Sequence[int],
              failed: bool) -> None:
        """A request ended: `reused` of its `prompt_tokens` came from the cache; `kv_tokens` what
        its KV holds now; a failed one takes no hint's state."""
        self.requests += 1
        self.prompt_tokens += prompt_tokens
        self.reused_tokens += reused
        if self.predictive is not None and hint is not None:
            self.predictive.ended(hint.session, None if failed else hint.state, kv_tokens,
                                  tool=None if failed else hint.tool)

    def stats(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "name": self.policy.name, "requests": self.requests, "prompt_tokens": self.prompt_tokens,
            "reused_tokens": self.reused_tokens,
            "hit_rate": round(self.reused_tokens / self.prompt_tokens, 4) if self.prompt_tokens else None,
        }
        if self.predictive is not None:
            out["predictor"] = self.predictive.model.summary()
        return out
