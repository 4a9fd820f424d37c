"""--cache-policy (issue 58, item 5): the policies by name, the order of resident owners under each,
the events the router feeds the predictive model, and what /cache/stats reports of them."""

from __future__ import annotations

import itertools
from dataclasses import dataclass, field

import pytest

from server.cache.eviction import LifecyclePolicy, LRUPolicy
from server.cache.lifecycle import CacheHint, SessionRegistry
from server.cache.lifecycle_model import ModelParams
from server.cache.lifecycle_priors import PriorsError, save_priors
from server.cache.policy_choice import choose_policy, owner_rank
from server.cache.policy_events import PolicyEvents
from server.cache.predictive_policy import PredictivePolicy
from server.settings import ServerSettings

_stamps = itertools.count(1)


@dataclass(eq=False)
class FakeOwner:
    sessions: set[str]
    last_used: int = field(default_factory=lambda: next(_stamps))


class FakeResident:
    rank = None


def test_the_three_policies_by_name(tmp_path):
    reg = SessionRegistry()
    assert isinstance(choose_policy("lru", reg), LRUPolicy)
    assert isinstance(choose_policy("lifecycle", reg), LifecyclePolicy)
    predictive = choose_policy("predictive", reg, ModelParams(gamma=0.7))
    assert isinstance(predictive, PredictivePolicy) and predictive.model.params.gamma == 0.7
    with pytest.raises(ValueError, match="unknown cache policy"):
        choose_policy("fifo", reg)
    (tmp_path / "bad.json").write_text("{}")
    with pytest.raises(PriorsError, match="not a lifecycle priors file"):
        choose_policy("predictive", reg, priors=tmp_path / "bad.json")
    good = choose_policy("predictive", reg)
    assert isinstance(good, PredictivePolicy)
    save_priors(good.model.online, tmp_path / "p.json")
    assert isinstance(choose_policy("predictive", reg, priors=tmp_path / "p.json"), PredictivePolicy)


def test_settings_name_the_policy_and_the_predictors_parameters():
    s = ServerSettings(cache_policy="lru", cache_predict_step=1.5, cache_predict_horizon=4)
    assert s.cache_policy == "lru"
    assert (s.predict_params.step_s, s.predict_params.horizon) == (1.5, 4)
    default = ServerSettings()
    assert default.cache_policy == "predictive" and default.cache_prefetch == "on", \
        "the benchmarks' choice (docs/cache-policies.md, the default)"


def test_resident_owners_go_in_the_policys_order():
    reg = SessionRegistry()
    old, new = FakeOwner({"a"}), FakeOwner({"b"})
    lru = owner_rank(LRUPolicy())
    assert lru is not None and lru(old) < lru(new)
    assert owner_rank(LifecyclePolicy(reg)) is None, "the lifecycle classes are the owners' own order"
    predictive = choose_policy("predictive", reg)
    rank = owner_rank(predictive)
    assert rank is not None
    reg.observe(CacheHint("b", pin=True))
    assert rank(new) is None, "a pinned session's owner never goes"
    assert rank(old) == (0.0, old.last_used)


def test_the_router_events_teach_the_model_and_report():
    reg = SessionRegistry()
    policy = choose_policy("predictive", reg)
    assert isinstance(policy, PredictivePolicy)
    resident = FakeResident()
    events = PolicyEvents(policy, reg, resident)  # type: ignore[arg-type]
    assert resident.rank is not None
    hint = CacheHint("s/main", "tool_wait")
    events.arrived(hint, list(range(50)))
    assert policy.model.state("s/main") == "model_call"
    events.ended(hint, 50, 20, list(range(60)), failed=False)
    reg.observe(hint)  # (the router's write-back policy records the hint in the registry)
    assert policy.model.state("s/main") == "tool_wait"
    reg.apply(CacheHint("s/main", "done"))  # a bare hint reaches the model through the registry
    assert policy.model.state("s/main") == "done"
    stats = events.stats()
    assert stats["name"] == "predictive" and stats["hit_rate"] == 0.4
    assert stats["predictor"]["by_state"]["done"] == 1
    lru_stats = PolicyEvents(LRUPolicy(), SessionRegistry(), None).stats()
    assert lru_stats["name"] == "lru" and "predictor" not in lru_stats and lru_stats["hit_rate"] is None
