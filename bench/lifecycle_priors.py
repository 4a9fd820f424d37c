"""Build the lifecycle model's priors file from recorded runs (issue 58, item 2).

    python -m bench.lifecycle_priors MANIFEST [--results RESULTS.json] [MANIFEST [--results ...]] --out priors.json
    arbor-server --cache-policy predictive --cache-priors priors.json

A manifest (the workbench's export, `arbor replay record`, a generated workload) says which
session each request belongs to, what it continues and so the hint it ends with (the replay's,
harness/serving/runner.py: tool_wait, active at a fork point, done); the results of its replay
(`arbor replay ... --out RESULTS.json`) say when each request really started and ended. Without
results each line starts at its `t` (or, with `--concurrency N`, as `arbor replay --concurrency N`
would start it) and lasts what a service model says (bench/cachesim/schedule.py).
The events go through the server's own model (server/cache/lifecycle_model.py), whose counts
of transitions and dwell times become the file's N^off. Several manifests add up.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from bench.cachesim.priors import record_counts
from bench.cachesim.schedule import concurrency_schedule, recorded_schedule, timed_schedule
from bench.cachesim.trace import trace_from_lines
from harness.manifest import read_manifest
from harness.reports.results import load_results
from server.cache.lifecycle_counts import STATES, merge
from server.cache.lifecycle_priors import save_priors


def counts_of(manifest: Path, results: Path | None, concurrency: int | None = None):
    trace = trace_from_lines(read_manifest(manifest), source=str(manifest))
    if results is not None:
        records = sorted(load_results(results).requests, key=lambda r: r.index)
        if len(records) != len(trace.requests):
            raise SystemExit(f"{results} has {len(records)} requests, {manifest} {len(trace.requests)}")
        events = recorded_schedule([r.start_s or 0.0 for r in records], [r.latency_s or 0.0 for r in records])
    else:
        events = timed_schedule(trace) if concurrency is None else concurrency_schedule(trace, concurrency)
    return record_counts(trace, events), trace


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(prog="python -m bench.lifecycle_priors", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("manifests", nargs="+", type=Path)
    p.add_argument("--results", type=Path, action="append", default=[],
                   help="the results of the manifests' replays, in the same order (all or none)")
    p.add_argument("--concurrency", type=int, help="without results: start the lines as a replay with this "
                   "concurrency would (default: each at its t)")
    p.add_argument("--out", type=Path, required=True)
    a = p.parse_args(argv)
    if a.results and len(a.results) != len(a.manifests):
        p.error("give one --results per manifest, or none")
    pairs = zip(a.manifests, a.results or [None] * len(a.manifests))
    built = [counts_of(m, r, a.concurrency) for m, r in pairs]
    counts = merge(c for c, _ in built)
    save_priors(counts, a.out, sources=[str(m) for m in a.manifests] + [str(r) for r in a.results],
                requests=sum(len(t.requests) for _, t in built), sessions=sum(t.sessions for _, t in built))
    print(json.dumps({i: {j: n for j, n in counts.transitions[i].items() if n} for i in STATES}))
    print(f"wrote {a.out}")


if __name__ == "__main__":
    main()
