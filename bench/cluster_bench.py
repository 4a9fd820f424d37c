"""The agent workload over two arbor-server replicas: SMG cache_aware, SMG round_robin, and one
replica alone (no router), side by side in one run on the same sessions.

    python -m bench.cluster_bench [--sessions 8] [--turns 4] [--concurrency 4] [--threads 1]
        [--user-len 400] [--tool-result-len 15] [--think-max-s 1.5] [--out bench/results/cluster]

Each configuration gets fresh replicas (no cache carries over). Reported: wall time, the
servers' time to first token (their prefill time, `timings.prompt_ms`), client latency,
computed prompt tokens and computed/ideal (the ideal on the server's own tokens, as
bench/run_all.py computes it), the share of each session's turns on its home replica, and
sessions per replica. Prints a markdown table and writes the raw figures to --out.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import time
from collections import Counter
from pathlib import Path

import httpx

from app.replay.generators import agent_sessions
from app.replay.ideal import ideal_computed
from app.replay.server_probe import ServerTokenizer
from bench.cluster import replicas, router
from bench.cluster_sessions import SessionRun, drive

ALIAS = "arbor-bench"
CONFIGS = ("cache_aware", "round_robin", "one replica")


def _summary(name: str, run: SessionRun, wall_s: float, ideal: int) -> dict:
    ok = [t for t in run.turns if t.status == 200]
    ttft = sorted(t.prompt_ms for t in ok if t.prompt_ms is not None)
    homes = Counter(run.home().values())
    return {"config": name, "wall_s": round(wall_s, 1), "requests": len(run.turns), "ok": len(ok),
            "ttft_ms_mean": round(statistics.fmean(ttft), 1) if ttft else None,
            "ttft_ms_p90": round(ttft[int(0.9 * (len(ttft) - 1))], 1) if ttft else None,
            "latency_s_mean": round(statistics.fmean(t.latency_s for t in ok), 2) if ok else None,
            "computed": run.computed(), "ideal": ideal,
            "computed_over_ideal": round(run.computed() / ideal, 2) if ideal else None,
            "min_affinity": round(min(run.affinity().values()), 2),
            "sessions_per_replica": sorted(homes.values(), reverse=True)}


async def _ideal(base_url: str, lines) -> int:
    async with httpx.AsyncClient() as client:
        tok = ServerTokenizer(client, base_url, {})
        prompts = [await tok.tokens(line.body) for line in lines]
    return ideal_computed(prompts).ideal_computed_tokens


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(prog="python -m bench.cluster_bench", description=__doc__.split("\n\n")[0])
    p.add_argument("--sessions", type=int, default=8)
    p.add_argument("--turns", type=int, default=4)
    p.add_argument("--concurrency", type=int, default=4)
    p.add_argument("--threads", type=int, default=1, help="arbor-server --threads of each replica")
    p.add_argument("--user-len", type=int, default=400, help="words of each session's own task")
    p.add_argument("--tool-result-len", type=int, default=15)
    p.add_argument("--think-max-s", type=float, default=1.5, help="random tool time before each later turn")
    p.add_argument("--out", type=Path, default=Path("bench/results/cluster"))
    a = p.parse_args(argv)
    lines = agent_sessions(sessions=a.sessions, turns=a.turns, system_len=40, user_len=a.user_len,
                           tool_result_len=a.tool_result_len, tool_call_len=8, output_len=8, model=ALIAS).lines
    args = ["--threads", str(a.threads), "--parallel", "4", "--alias", ALIAS]
    a.out.mkdir(parents=True, exist_ok=True)
    rows, ideal = [], None
    for name in CONFIGS:
        logs = a.out / "logs" / name.replace(" ", "_")
        n = 1 if name == "one replica" else 2
        with replicas(n, args, logs) as servers:
            if ideal is None:
                ideal = asyncio.run(_ideal(servers[0].base_url, lines))
            if n == 1:
                t0 = time.perf_counter()
                run = asyncio.run(drive(servers[0].base_url, lines, a.concurrency, think_max_s=a.think_max_s))
            else:
                with router([s.base_url for s in servers], logs, name) as smg:
                    t0 = time.perf_counter()
                    run = asyncio.run(drive(smg.base_url, lines, a.concurrency, think_max_s=a.think_max_s))
            rows.append(_summary(name, run, time.perf_counter() - t0, ideal))
        print(json.dumps(rows[-1]), flush=True)
    (a.out / "cluster.json").write_text(json.dumps({"params": vars(a) | {"out": str(a.out)}, "rows": rows}, indent=1))
    print("| configuration | wall s | TTFT ms mean / p90 | latency s | computed | computed/ideal "
          "| min affinity | sessions per replica |")
    print("|---|---|---|---|---|---|---|---|")
    for r in rows:
        print(f"| {r['config']} | {r['wall_s']} | {r['ttft_ms_mean']} / {r['ttft_ms_p90']} | {r['latency_s_mean']} "
              f"| {r['computed']} | {r['computed_over_ideal']} | {r['min_affinity']} | {r['sessions_per_replica']} |")


if __name__ == "__main__":
    main()
