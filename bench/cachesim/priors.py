"""Offline priors for the lifecycle model from a recorded (or simulated) run: the events a server
would have seen, fed through the server's own model (server/cache/lifecycle_model.py) and fork
finder (predictive_policy.Tips), whose online counts become the priors file's N^off."""

from __future__ import annotations

from collections.abc import Sequence

from bench.cachesim.schedule import ARRIVE, Event
from bench.cachesim.trace import Trace
from server.cache.lifecycle_model import Counts, LifecycleModel, ModelParams
from server.cache.predictive_policy import PredictivePolicy


def record_counts(trace: Trace, events: Sequence[Event], params: ModelParams | None = None) -> Counts:
    """The transition counts and dwell times of `trace` admitted as `events` say."""
    now = [0.0]
    model = LifecycleModel(params, clock=lambda: now[0])
    policy = PredictivePolicy(model)
    for event in events:
        now[0] = event.time
        req = trace.requests[event.index]
        if event.kind == ARRIVE:
            policy.arrived(req.session, req.tokens)
        else:
            policy.ended(req.session, req.hint, req.tokens, tool=req.tool)
    model.finish(now[0])
    return model.online
