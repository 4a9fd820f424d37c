"""When each request of a trace reaches the server and ends, as the replay would send them.

`concurrency_schedule`: `arbor replay --concurrency N` (harness/serving/runner.py): a line first
waits for the line it depends on, then for one of N places, first come first served. A request
lasts a service time of its own (`ServiceModel`: a fixed part, its novel prompt tokens (what the
ideal computes of it, so the order does not depend on the policy being simulated) and its output
tokens). `timed_schedule`: `--schedule`, each line at its `t` (after its dependency), no cap.
`recorded_schedule`: the starts and ends a real replay measured (its results file), to judge a
real run against the bound of the very order it ran in.

Every policy of one comparison is simulated on the same events, so they differ only in what
they keep.
"""

from __future__ import annotations

import heapq
from collections import defaultdict, deque
from collections.abc import Sequence
from dataclasses import dataclass

from bench.cachesim.trace import Trace

ARRIVE, END = "arrive", "end"


@dataclass(frozen=True)
class ServiceModel:
    """Seconds a request takes; defaults near the embedded model on 2 shared cores, 4 streams."""

    base_s: float = 0.05
    prefill_s_per_token: float = 0.0015
    decode_s_per_token: float = 0.03

    def seconds(self, novel_tokens: int, output_tokens: int) -> float:
        return self.base_s + self.prefill_s_per_token * novel_tokens + self.decode_s_per_token * output_tokens


@dataclass(frozen=True, order=True)
class Event:
    time: float
    rank: int  # ends before arrivals at the same time: a place freed is taken at once
    seq: int
    kind: str
    index: int


def _events(starts: dict[int, float], ends: dict[int, float]) -> list[Event]:
    """Arrivals at one time keep the order they started in (`starts`' order), ends the order they ended in."""
    events = [Event(t, 1, k, ARRIVE, i) for k, (i, t) in enumerate(starts.items())]
    events += [Event(t, 0, k, END, i) for k, (i, t) in enumerate(ends.items())]
    return sorted(events)


def _dependents(trace: Trace) -> dict[int, list[int]]:
    out: dict[int, list[int]] = defaultdict(list)
    for r in trace.requests:
        if r.waits_for is not None:
            out[r.waits_for].append(r.index)
    return out


def concurrency_schedule(trace: Trace, concurrency: int, service: ServiceModel | None = None) -> list[Event]:
    if concurrency < 1:
        raise ValueError("concurrency must be at least 1")
    service = service or ServiceModel()
    novel = trace.ideal.computed
    deps = _dependents(trace)
    ready: deque[int] = deque(r.index for r in trace.requests if r.waits_for is None)
    running: list[tuple[float, int]] = []
    starts: dict[int, float] = {}
    ends: dict[int, float] = {}
    now = 0.0
    while ready or running:
        while ready and len(running) < concurrency:
            i = ready.popleft()
            r = trace.requests[i]
            starts[i] = now
            heapq.heappush(running, (now + service.seconds(novel[i], r.output_tokens), i))
        if not running:
            break
        now, i = heapq.heappop(running)
        ends[i] = now
        ready.extend(deps.get(i, ()))
    return _events(starts, ends)


def timed_schedule(trace: Trace, service: ServiceModel | None = None) -> list[Event]:
    """Each line at its `t`, or when the line it waits for ends, whichever is later."""
    service = service or ServiceModel()
    novel = trace.ideal.computed
    starts: dict[int, float] = {}
    ends: dict[int, float] = {}
    for r in trace.requests:  # a line waits only for an earlier one
        start = max(r.t, ends[r.waits_for]) if r.waits_for is not None else r.t
        starts[r.index] = start
        ends[r.index] = start + service.seconds(novel[r.index], r.output_tokens)
    return _events(starts, ends)


def recorded_schedule(starts: Sequence[float], latencies: Sequence[float]) -> list[Event]:
    """The events of a real replay: each request's start and start + latency (seconds)."""
    order = sorted(range(len(starts)), key=lambda i: (starts[i], i))
    ends = {i: starts[i] + latencies[i] for i in sorted(order, key=lambda i: (starts[i] + latencies[i], i))}
    return _events({i: starts[i] for i in order}, ends)


def arrival_order(events: Sequence[Event]) -> list[int]:
    """Request indexes in the order they arrive."""
    return [e.index for e in events if e.kind == ARRIVE]
