"""The eviction policies on the real server, side by side, each judged against the bound (issue 58).

    python -m bench.cache_policy [--sessions 16 --turns 4 --branches 2 --fork-after 2] [--cache-ram 64]
        [--concurrency 4] [--policies lru,lifecycle,predictive,predictive+priors] [--out PATH]

Issue 58's workload (16 agent sessions of 4 turns forking into 2 branches after 2: 96 requests, 4 at
a time) replayed (harness/serving/runner.py, hints as headers, output lengths forced) against a
fresh arbor-server per policy with a 64 MiB host tier, in one run. `predictive+priors` loads a
priors file recorded from the LRU run of the same workload (its requests' real starts and ends:
yesterday's run of the same agents; python -m bench.lifecycle_priors). A name ending in `@MiB` runs
that policy with a host tier of that size instead (`predictive@1024`: an ample host, the floor any
policy could reach on this machine's TTFT, measured beside the others). For each run: computed
prompt tokens, wall time, TTFT p50 (all requests, and those after a tool wait), the engine
thread's longest cache step, /cache/stats' policy report; and beside it what the simulator
(bench/cachesim/) computes on the server's own tokens *in the order that run admitted its
requests*: Bélády's bound and the same policy, so a run is judged by its distance to the bound.
Each run's replay results (every request) go beside `--out`, in a folder of its name. The
machine is shared and noisy: wall and TTFT move between runs; the token counts do not much.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import tempfile
from pathlib import Path
from typing import Any

import httpx

from bench.cache_sim import ServerTokens
from bench.cachesim.gap import gap_by_kind
from bench.cachesim.priors import record_counts
from bench.cachesim.schedule import recorded_schedule
from bench.cachesim.simulator import EMBEDDED_BYTES_PER_TOKEN, Budgets, Simulator
from bench.cachesim.trace import Trace, trace_from_lines
from harness.manifest import ManifestLine
from harness.reports.results import RunResult
from harness.serving.ports import free_port
from harness.serving.runner import ReplaySettings, hint_states, replay
from harness.serving.servers import arbor_command, running
from harness.workloads.generators import agent_sessions
from server.cache.lifecycle_priors import save_priors

POLICIES = ("lru", "lifecycle", "predictive", "predictive+priors")
NO_PREFETCH = "-noprefetch"  # a policy name's suffix: the same policy with --cache-prefetch off
HOST_MIB = "@"  # a policy name's suffix `@MiB`: the same policy with a host tier of that size (e.g. an ample one)


def host_mib(policy: str, default: int) -> int:
    """The host tier's MiB for a policy name: its `@MiB` suffix, else `default` (--cache-ram)."""
    _, at, mib = policy.partition(HOST_MIB)
    return int(mib) if at else default


def server_args(policy: str) -> list[str]:
    """arbor-server's flags for a policy name: `lru`, `lifecycle`, `predictive`, `predictive+priors`
    (the priors file is added by the caller), any of them ending in -noprefetch and then in @MiB
    (the host tier's size is added by the caller)."""
    name = policy.partition(HOST_MIB)[0].split("+")[0]
    args = ["--cache-policy", name.removesuffix(NO_PREFETCH)]
    if name.endswith(NO_PREFETCH):
        args += ["--cache-prefetch", "off"]
    return args


def after_tool_wait(lines: list[ManifestLine], run: RunResult) -> list[float]:
    """TTFTs of the requests that follow a tool wait of their branch."""
    states = hint_states(lines)
    last: dict[str, int] = {}
    out = []
    for i, line in enumerate(lines):
        prev = last.get(line.cache_session)
        r = run.requests[i]
        if prev is not None and states[prev] == "tool_wait" and r.ttft_s is not None:
            out.append(r.ttft_s)
        last[line.cache_session] = i
    return out


def file_name(policy: str) -> str:
    return policy.replace("+", "_").replace(HOST_MIB, "_host")


def mean_step_ms(engine_thread: dict) -> float | None:
    calls = engine_thread.get("decode_calls")
    return round(engine_thread["decode_ms"] / calls, 3) if calls else None


def quantile(values: list[float], q: float) -> float | None:
    if not values:
        return None
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def bound_of(trace: Trace, run: RunResult, budgets: Budgets, policy: str) -> dict[str, Any]:
    """The simulator's bound and policy on this run's own admission order (`trace`: the server's tokens),
    and where the run computed more or less than the simulated policy (`gap`, bench/cachesim/gap.py)."""
    records = sorted(run.requests, key=lambda r: r.index)
    events = recorded_schedule([r.start_s or 0.0 for r in records], [r.latency_s or 0.0 for r in records])
    name = policy.partition(HOST_MIB)[0]
    sim_policy = "predictive" if name.startswith("predictive") else name.removesuffix(NO_PREFETCH)
    simulated = Simulator(trace, events, budgets, sim_policy).run()
    real = [(r.prompt_tokens or 0) - (r.cached_tokens or 0) for r in records]
    return {"bound": Simulator(trace, events, budgets, "belady").run().computed,
            "simulated": simulated.computed, "ideal": trace.ideal.ideal_computed_tokens,
            "gap": gap_by_kind(trace, real, simulated.per_request)}


def run_one(a: argparse.Namespace, lines: list[ManifestLine], policy: str, priors: Path | None, log_dir: Path,
            trace: Trace | None) -> tuple[RunResult, dict[str, Any], list[str], Trace]:
    """One policy on a fresh server; the trace on the server's tokens (tokenized by it after the run, once)."""
    port = free_port()
    args = ["--cache-ram", str(host_mib(policy, a.cache_ram)), *server_args(policy), *a.server_args]
    if priors is not None:
        args += ["--cache-priors", str(priors)]
    cmd = arbor_command(port, a.model, args)
    with running(f"cache_policy_{file_name(policy)}", cmd, port, log_dir) as srv:
        result = asyncio.run(replay(lines, ReplaySettings(base_url=srv.v1, concurrency=a.concurrency,
                                                           force_output_length=True, progress=False, label=policy)))
        stats = httpx.get(srv.base_url + "/cache/stats", timeout=60).json()
        if trace is None:
            with httpx.Client(base_url=srv.base_url, timeout=120) as client:
                trace = trace_from_lines(lines, ServerTokens(client))
    return result, stats, cmd, trace


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(prog="python -m bench.cache_policy", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--sessions", type=int, default=16)
    p.add_argument("--turns", type=int, default=4)
    p.add_argument("--branches", type=int, default=2)
    p.add_argument("--fork-after", type=int, default=2)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--concurrency", type=int, default=4)
    p.add_argument("--cache-ram", type=int, default=64, help="MiB of the host tier")
    p.add_argument("--policies", default=",".join(POLICIES))
    p.add_argument("--tool-wait", default=None, metavar="LO,HI",
                   help="seconds each tool call takes (a typical latency per tool in [LO, HI], each call around "
                   "it): the request after a tool call is sent that long after its predecessor ended")
    p.add_argument("--model", type=Path)
    p.add_argument("--server-arg", dest="server_args", action="append", default=[],
                   help="one more arbor-server argument (repeat)")
    p.add_argument("--out", type=Path, default=Path("bench/results/cache_policy.json"))
    a = p.parse_args(argv)
    policies = [x for x in a.policies.split(",") if x]
    tool_wait = None
    if a.tool_wait:
        lo, hi = (float(x) for x in a.tool_wait.split(","))
        tool_wait = (lo, hi)
    lines = agent_sessions(sessions=a.sessions, turns=a.turns, branches=a.branches, fork_after=a.fork_after,
                           seed=a.seed, tool_wait_s=tool_wait).lines
    out: dict[str, Any] = {"bench": "cache_policy", "workload": {"sessions": a.sessions, "turns": a.turns,
                           "branches": a.branches, "fork_after": a.fork_after, "requests": len(lines),
                                        "tool_wait_s": list(tool_wait) if tool_wait else None,
                                        "server_args": a.server_args},
                           "concurrency": a.concurrency, "cache_ram_mib": a.cache_ram, "runs": [],
                           "note": "one run per policy on a shared 2-core machine: wall and TTFT are noisy"}
    trace: Trace | None = None
    with tempfile.TemporaryDirectory() as tmp:
        log_dir = Path(tmp) / "logs"
        runs: dict[str, RunResult] = {}
        for policy in policies:
            priors = None
            if policy.startswith("predictive+priors"):
                if "lru" not in runs:
                    raise SystemExit("predictive+priors records its priors from the lru run: list lru first")
                records = sorted(runs["lru"].requests, key=lambda r: r.index)
                counts = record_counts(trace_from_lines(lines), recorded_schedule(
                    [r.start_s or 0.0 for r in records], [r.latency_s or 0.0 for r in records]))
                priors = Path(tmp) / "priors.json"
                save_priors(counts, priors, sources=["the lru run of this benchmark"])
            result, stats, cmd, trace = run_one(a, lines, policy, priors, log_dir, trace)
            runs[policy] = result
            result.save(a.out.with_suffix("") / f"{file_name(policy)}.json")  # every request's figures
            s = result.summary
            after = after_tool_wait(lines, result)
            row = {"policy": policy, "command": " ".join(cmd), "computed": s["tokens"]["computed"],
                   "prompt": s["tokens"]["prompt"], "errors": s["errors"], "wall_s": round(s["wall_s"], 2),
                   "ttft_p50_s": s["ttft_s"].get("p50"),
                   "ttft_p50_after_tool_wait_s": statistics.median(after) if after else None,
                   "ideal": s.get("ideal", {}).get("ideal_computed_tokens"),
                   "max_step_cache_ms": stats.get("engine_thread", {}).get("max_step_cache_ms"),
                   "max_step_cache_ms_by_kind": stats.get("engine_thread", {}).get("max_step_cache_ms_by_kind"),
                   "restores_in_pieces": stats.get("restores_in_pieces"),
                   "restores_staged": stats.get("restores_staged"), "write_back": stats.get("write_back"),
                   "decode_step_ms_mean": mean_step_ms(stats.get("engine_thread", {})),
                   "host": {k: stats["tiers"]["H"].get(k) for k in ("tokens", "held_bytes", "evictions", "declined")},
                   "ttft_p90_after_tool_wait_s": quantile(after, 0.9),
                   "reused_by_source": stats.get("reused_tokens_by_source"),
                   "prefetch": stats.get("prefetch"),
                   "policy_stats": stats.get("policy"), "cache_ram_mib": host_mib(policy, a.cache_ram),
                   "sim": bound_of(trace, result, Budgets(host_bytes=host_mib(policy, a.cache_ram) << 20,
                                                          bytes_per_token=EMBEDDED_BYTES_PER_TOKEN), policy)}
            out["runs"].append(row)
            print(f"{policy:18s} computed={row['computed']} ideal={row['ideal']} bound={row['sim']['bound']} "
                  f"simulated={row['sim']['simulated']} wall={row['wall_s']}s ttft_p50={row['ttft_p50_s']} "
                  f"after_tool={row['ttft_p50_after_tool_wait_s']} max_step_cache_ms={row['max_step_cache_ms']} "
                  f"prefetch={row['prefetch']}", flush=True)
            a.out.parent.mkdir(parents=True, exist_ok=True)
            a.out.write_text(json.dumps(out, indent=1) + "\n")  # after every run: a partial run counts
    print(f"wrote {a.out}")


if __name__ == "__main__":
    main()
