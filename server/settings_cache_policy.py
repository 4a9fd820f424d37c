"""arbor-server's eviction-policy flags (issue 58): which order the prefix cache's tiers evict in,
and the lifecycle model's parameters (server/cache/lifecycle_model.py).

A mixin of ServerSettings (server/settings.py), as the speculative-decoding flags are. The
predictor's defaults are the ones `python -m bench.cache_sim --sweep` found best on issue 58's
workload, where they held across a 4x slower service (docs/benchmark-notes.md).
"""

from __future__ import annotations

from pathlib import Path
from typing import Literal

from pydantic import Field, field_validator
from pydantic.config import JsonDict
from pydantic_settings import BaseSettings

from server.cache.lifecycle_model import ModelParams
from server.cache.lifecycle_priors import PriorsError, load_priors

_CACHE: JsonDict = {"group": "prefix cache"}
_DEFAULTS = ModelParams()

CachePolicy = Literal["lru", "lifecycle", "predictive"]


class CachePolicySettings(BaseSettings):
    cache_policy: CachePolicy = Field(
        "predictive", description="the order every tier (resident, host, disk) evicts in: lru (least recently "
        "used; seed 003's LRU), lifecycle (the hints' classes: finished sessions first, tool waits last, LRU "
        "within; seed 003's QUEUE_WINDOW), predictive (the lifecycle model's expected reuse of each block, from "
        "the hints, arrivals, forks and learnt wait times; seed 003's BAYES_LIFECYCLE)", json_schema_extra=_CACHE)
    cache_priors: Path | None = Field(
        None, description="the lifecycle model's priors (python -m bench.lifecycle_priors builds one from "
        "recorded runs); without one it learns online only", json_schema_extra=_CACHE)
    cache_predict_alpha: float = Field(_DEFAULTS.alpha, gt=0, description="the lifecycle model's smoothing "
                                       "pseudo-count per transition", json_schema_extra=_CACHE)
    cache_predict_horizon: int = Field(_DEFAULTS.horizon, ge=1, le=4096, description="steps the lifecycle model "
                                       "looks ahead", json_schema_extra=_CACHE)
    cache_predict_step: float = Field(_DEFAULTS.step_s, gt=0, description="seconds in one of the lifecycle model's "
                                      "steps", json_schema_extra=_CACHE)
    cache_predict_gamma: float = Field(_DEFAULTS.gamma, gt=0, le=1, description="the lifecycle model's decay per "
                                       "step", json_schema_extra=_CACHE)
    cache_predict_quiet: float = Field(_DEFAULTS.quiet_s, gt=0, description="seconds a waiting session may send "
                                       "nothing before the lifecycle model counts it gone quiet",
                                       json_schema_extra=_CACHE)

    cache_prefetch: Literal["on", "off"] = Field(
        "on", description="bring a waiting session's KV back from host or disk to a resident owner before the "
        "lifecycle model expects its next call (the predictive policy only; docs/cache-policies.md)",
        json_schema_extra=_CACHE)
    cache_prefetch_min_value: float = Field(
        0.25, gt=0, description="the predicted value (discounted chance of a call within the horizon) a waiting "
        "session needs to be prefetched", json_schema_extra=_CACHE)
    cache_prefetch_step: int = Field(
        4096, ge=1, description="KiB a prefetch restores per engine step while requests run (all at once when "
        "idle): the longest stall it adds", json_schema_extra=_CACHE)

    @field_validator("cache_priors")
    @classmethod
    def _priors_readable(cls, path: Path | None) -> Path | None:
        """A priors file named but unusable is refused at start, with the reason."""
        if path is not None:
            try:
                load_priors(path)
            except PriorsError as exc:
                raise ValueError(str(exc)) from None
        return path

    @property
    def predict_params(self) -> ModelParams:
        return ModelParams(alpha=self.cache_predict_alpha, horizon=self.cache_predict_horizon,
                           step_s=self.cache_predict_step, gamma=self.cache_predict_gamma,
                           quiet_s=self.cache_predict_quiet)
