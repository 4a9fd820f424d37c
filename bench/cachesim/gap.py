"""Where a real run computed more than the simulator on the same order (issue 58: the real server
stays above the simulator's same policy): each request's computed prompt tokens, real against
simulated, summed by the request's place in its session.

Kinds: `first` (a session's first request that follows no other), `fork` (a session's first
request that follows another session's: a branch forked from it, its parent's path the prefix it
wants), `next` (any later request of a session). Pure: lists of numbers and the trace in, a dict out.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from bench.cachesim.trace import Trace

KINDS = ("first", "fork", "next")


def kind_of(trace: Trace, index: int) -> str:
    req = trace.requests[index]
    seen = any(r.session == req.session for r in trace.requests[:index])
    if seen:
        return "next"
    if req.waits_for is not None and trace.requests[req.waits_for].session != req.session:
        return "fork"
    return "first"


def gap_by_kind(trace: Trace, real: Sequence[int], simulated: Sequence[int]) -> dict[str, dict[str, Any]]:
    """Per kind: requests, real and simulated computed tokens, `over` (the real run's tokens beyond the
    simulator's, summed over the requests where it computed more) and `under` (the reverse)."""
    if not len(real) == len(simulated) == len(trace.requests):
        raise ValueError("one real and one simulated figure per request of the trace")
    out = {k: {"requests": 0, "real": 0, "simulated": 0, "over": 0, "under": 0} for k in KINDS}
    for i, (r, s) in enumerate(zip(real, simulated)):
        row = out[kind_of(trace, i)]
        row["requests"] += 1
        row["real"] += r
        row["simulated"] += s
        row["over"] += max(0, r - s)
        row["under"] += max(0, s - r)
    return out
