"""The trace-driven bound (issue 58, item 1): computed prompt tokens per eviction policy, no model.

    python -m bench.cache_sim [--sessions 16 --turns 4 --branches 2 --fork-after 2] [--host-mib 64]
        [--concurrency 4] [--tokenizer words|server] [--manifest M.jsonl [--results R.json]]
        [--priors P.json] [--sweep] [--out bench/results/cache_sim.json]

Simulates (bench/cachesim/) the workload against Arbor's radix tree and policies within the tier
budgets, each policy on the same admission order: `lru`, `lifecycle` (the hint classes, the
server's policy before issue 58), `predictive` learning online only and with priors (by default
recorded from the same generator with the next seed: yesterday's run of the same agents), and
`belady`, the bound; beside the workload's ideal; and the predictive policy with prefetch
(bench/cachesim/prefetch.py; the server's is server/cache/prefetch.py), which moves host restores off admission.
The default workload is issue 58's: 16 agent sessions of 4 turns that fork into 2 branches after
2 (96 requests, 4 at a time) at a 64 MiB host tier. `--manifest` simulates any manifest instead
(with `--results`, in the order and at the times a real replay of it ran: how far that run was
from the bound). `--tokenizer server` counts
the server's tokens (a short-lived arbor-server with `--model` renders and tokenizes each body);
`words` (the default, no model) counts word pieces. `--sweep` runs the predictive policy over a
grid of its parameters (alpha, horizon, step, gamma): how the server's defaults were chosen.
"""

from __future__ import annotations

import argparse
import itertools
import json
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import httpx

from bench.cachesim.priors import record_counts
from bench.cachesim.schedule import ServiceModel, concurrency_schedule, recorded_schedule, timed_schedule
from bench.cachesim.simulator import EMBEDDED_BYTES_PER_TOKEN, Budgets, SimResult, Simulator
from bench.cachesim.trace import Trace, trace_from_lines
from harness.manifest import ManifestLine, read_manifest
from harness.reports.results import load_results
from harness.serving.ports import free_port
from harness.serving.servers import arbor_command, running
from harness.workloads.generators import agent_sessions
from server.cache.lifecycle_model import Counts, ModelParams
from server.cache.lifecycle_priors import load_priors

ROWS = ("lru", "lifecycle", "predictive_online", "predictive", "predictive_prefetch", "belady")
GRID = {"alpha": (0.5, 1.0, 4.0), "horizon": (8, 16, 32), "step_s": (0.25, 0.5, 1.0, 2.0), "gamma": (0.5, 0.7, 0.85)}


def generated_lines(a: argparse.Namespace, seed: int) -> list[ManifestLine]:
    return agent_sessions(scenario=a.scenario, sessions=a.sessions, turns=a.turns, branches=a.branches,
                          fork_after=a.fork_after, tool_result_len=a.tool_result_len, seed=seed).lines


class ServerTokens:
    """Each body's prompt as arbor-server renders and tokenizes it (/apply-template, /tokenize)."""

    def __init__(self, client: httpx.Client) -> None:
        self.client = client

    def __call__(self, body: dict) -> list[int]:
        payload = {"messages": body["messages"], **({"tools": body["tools"]} if body.get("tools") else {})}
        answer = self.client.post("/apply-template", json=payload)
        answer.raise_for_status()
        tokens = self.client.post("/tokenize", json={"content": answer.json()["prompt"], "add_special": True,
                                                      "parse_special": True})
        tokens.raise_for_status()
        return [t["id"] if isinstance(t, dict) else int(t) for t in tokens.json()["tokens"]]


def traces(a: argparse.Namespace) -> tuple[Trace, Trace | None]:
    """The trace to simulate, and the one priors are recorded from (None: online only)."""
    lines = read_manifest(a.manifest) if a.manifest else generated_lines(a, a.seed)
    prior_lines = None if a.manifest or a.priors else generated_lines(a, a.seed + 1)
    if a.tokenizer == "words":
        trace = trace_from_lines(lines, source=str(a.manifest or "agent_sessions"))
        return trace, None if prior_lines is None else trace_from_lines(prior_lines)
    port = free_port()
    args = ["--no-cache", *(["--model", str(a.model)] if a.model else [])]
    with running("cache_sim_tokenizer", arbor_command(port, None, args), port, Path(a.log_dir)) as srv, \
            httpx.Client(base_url=srv.base_url, timeout=120) as client:
        tokenize = ServerTokens(client)
        trace = trace_from_lines(lines, tokenize, source=str(a.manifest or "agent_sessions"))
        prior = None if prior_lines is None else trace_from_lines(prior_lines, tokenize)
    return trace, prior


def schedule_of(a: argparse.Namespace, trace: Trace) -> list:
    service = ServiceModel(a.base_s, a.prefill_s, a.decode_s)
    if a.results:
        run = load_results(a.results)
        records = sorted(run.requests, key=lambda r: r.index)
        return recorded_schedule([r.start_s or 0.0 for r in records], [r.latency_s or 0.0 for r in records])
    if a.schedule:
        return timed_schedule(trace, service)
    return concurrency_schedule(trace, a.concurrency, service)


def compare(trace: Trace, events: Sequence, budgets: Budgets, params: ModelParams,
            priors: Counts | None) -> dict[str, SimResult]:
    out = {p: Simulator(trace, events, budgets, p).run() for p in ("lru", "lifecycle", "belady")}
    out["predictive_online"] = Simulator(trace, events, budgets, "predictive", params).run()
    if priors is not None:
        out["predictive"] = Simulator(trace, events, budgets, "predictive", params, priors).run()
        out["predictive_prefetch"] = Simulator(trace, events, budgets, "predictive", params, priors,
                                               prefetch=True).run()
    return out


def sweep(trace: Trace, events: Sequence, budgets: Budgets, priors: Counts | None,
          prior_trace: Trace | None, a: argparse.Namespace) -> list[dict[str, Any]]:
    rows = []
    for alpha, horizon, step, gamma in itertools.product(*GRID.values()):
        params = ModelParams(alpha=alpha, horizon=int(horizon), step_s=step, gamma=gamma)
        counts = priors
        if prior_trace is not None:
            counts = record_counts(prior_trace, schedule_of(a, prior_trace), params)
        with_priors = Simulator(trace, events, budgets, "predictive", params, counts).run().computed \
            if counts is not None else None
        online = Simulator(trace, events, budgets, "predictive", params).run().computed
        rows.append({"alpha": alpha, "horizon": horizon, "step_s": step, "gamma": gamma,
                     "computed_priors": with_priors, "computed_online": online})
    return rows


def table(results: dict[str, SimResult], ideal: int) -> list[str]:
    bound = results["belady"].computed
    lines = [f"{'policy':<19} {'computed':>9} {'x ideal':>8} {'x bound':>8}  reused by tier (H, D: restored "
             "when admitted)",
             f"{'ideal':<19} {ideal:>9} {1.0:>8.3f} {ideal / bound:>8.3f}"]
    for name in ROWS:
        if name in results:
            r = results[name]
            lines.append(f"{name:<19} {r.computed:>9} {r.computed / ideal:>8.3f} {r.computed / bound:>8.3f}  "
                         f"{dict(r.reused_by_tier)}" + (f" prefetch {r.prefetch}" if r.prefetch else ""))
    return lines


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(prog="python -m bench.cache_sim", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    w = p.add_argument_group("workload")
    w.add_argument("--manifest", type=Path, help="simulate this manifest (default: generated agent sessions)")
    w.add_argument("--results", type=Path, help="with --manifest: a replay's results, whose starts and ends to use")
    w.add_argument("--scenario", default="edge_incident")
    w.add_argument("--sessions", type=int, default=16)
    w.add_argument("--turns", type=int, default=4)
    w.add_argument("--branches", type=int, default=2)
    w.add_argument("--fork-after", type=int, default=2)
    w.add_argument("--tool-result-len", type=int, default=150)
    w.add_argument("--seed", type=int, default=0)
    w.add_argument("--tokenizer", choices=("words", "server"), default="words")
    w.add_argument("--model", type=Path, help="--tokenizer server: the model (default: the embedded one)")
    w.add_argument("--log-dir", default="var/bench-logs")
    s = p.add_argument_group("schedule")
    s.add_argument("--concurrency", type=int, default=4)
    s.add_argument("--schedule", action="store_true", help="each line at its t (replay --schedule)")
    s.add_argument("--base-s", type=float, default=ServiceModel.base_s)
    s.add_argument("--prefill-s", type=float, default=ServiceModel.prefill_s_per_token)
    s.add_argument("--decode-s", type=float, default=ServiceModel.decode_s_per_token)
    b = p.add_argument_group("budgets")
    b.add_argument("--host-mib", type=float, default=64)
    b.add_argument("--device-cells", type=int, default=Budgets.device_cells)
    b.add_argument("--disk-mib", type=float, default=0)
    b.add_argument("--bytes-per-token", type=int, default=EMBEDDED_BYTES_PER_TOKEN)
    b.add_argument("--min-tokens", type=int, default=Budgets.min_tokens)
    m = p.add_argument_group("predictor")
    defaults = ModelParams()
    m.add_argument("--alpha", type=float, default=defaults.alpha)
    m.add_argument("--horizon", type=int, default=defaults.horizon)
    m.add_argument("--step-s", type=float, default=defaults.step_s)
    m.add_argument("--gamma", type=float, default=defaults.gamma)
    m.add_argument("--priors", type=Path, help="a priors file (python -m bench.lifecycle_priors)")
    m.add_argument("--sweep", action="store_true", help="the predictive policy over a grid of its parameters")
    p.add_argument("--out", type=Path, default=Path("bench/results/cache_sim.json"))
    a = p.parse_args(argv)

    t0 = time.perf_counter()
    trace, prior_trace = traces(a)
    events = schedule_of(a, trace)
    budgets = Budgets(device_cells=a.device_cells, host_bytes=int(a.host_mib * (1 << 20)),
                      disk_bytes=int(a.disk_mib * (1 << 20)), bytes_per_token=a.bytes_per_token,
                      min_tokens=a.min_tokens)
    params = ModelParams(alpha=a.alpha, horizon=a.horizon, step_s=a.step_s, gamma=a.gamma)
    priors = load_priors(a.priors) if a.priors else None
    if prior_trace is not None:
        priors = record_counts(prior_trace, schedule_of(a, prior_trace), params)
    results = compare(trace, events, budgets, params, priors)
    ideal = trace.ideal.ideal_computed_tokens
    print(json.dumps(trace.describe()))
    print("\n".join(table(results, ideal)))
    out: dict[str, Any] = {
        "bench": "cache_sim", "trace": trace.describe(), "budgets": vars(budgets), "params": vars(params),
        "schedule": "recorded" if a.results else "schedule" if a.schedule else f"concurrency {a.concurrency}",
        "priors": str(a.priors) if a.priors else f"recorded from seed {a.seed + 1}" if prior_trace else None,
        "ideal": ideal, "bound": results["belady"].computed,
        "results": {name: r.to_dict() for name, r in results.items()},
        "command": "python -m bench.cache_sim " + " ".join(argv if argv is not None else __import__("sys").argv[1:]),
    }
    if a.sweep:
        out["sweep"] = rows = sweep(trace, events, budgets, priors if a.priors else None, prior_trace, a)
        key = "computed_priors" if rows and rows[0]["computed_priors"] is not None else "computed_online"
        best = sorted(rows, key=lambda r: (r[key], r["computed_online"]))[:5]
        print("best of the sweep:", json.dumps(best, indent=1))
    out["seconds"] = round(time.perf_counter() - t0, 1)
    a.out.parent.mkdir(parents=True, exist_ok=True)
    a.out.write_text(json.dumps(out, indent=1) + "\n")
    print(f"wrote {a.out}")


if __name__ == "__main__":
    main()
