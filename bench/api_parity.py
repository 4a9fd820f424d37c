"""One long-prefix agent workload through each of the three APIs (issue 34, item 5's target):
Chat Completions, OpenAI Responses and Anthropic Messages should compute the same prompt tokens
and have TTFT within noise of each other.

    python -m bench.api_parity [--sessions 2] [--turns 3] [--system-len 600] [--rounds 1]
                               [--apis chat,responses,messages] [--out bench/results/api_parity]

The agent workload (harness.workloads.generators.agent_sessions: a shared system prompt and tool
schemas, a task per session, a growing history of tool calls and results) is generated once as
chat and translated into its Responses and Messages equivalents (harness/workloads/api_shapes.py: same
messages, tools, output length). Each API's manifest is replayed on a fresh arbor-server (a cold
cache each time, default tiers), greedy, every request streamed; per run: prompt, cached and
computed tokens from each API's own usage fields, the prompt token count of every request, TTFT
median and p90, wall, cache sources, /cache/stats' reused tokens. With ``--rounds N`` the APIs
run N times each, the order rotated every round, so the spread between rounds of one API says
what noise is on this machine. ``--interleaved N`` is a check of TTFT alone: N one-turn requests
whose prompts share nothing, the APIs taking turns on one server, so all three meet the same load.

Results: ``--out``/index.json, one replay results file per run (``arbor replay compare`` reads
them) and the servers' logs; :func:`report_section` is the docs/benchmarks.md table.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import shlex
import subprocess
import sys
import time
from dataclasses import replace
from pathlib import Path

import httpx
import numpy as np

from harness.manifest import API_PATHS, write_manifest
from harness.serving.runner import ReplaySettings, replay
from harness.serving.servers import ROOT, arbor_command, free_port, running
from harness.workloads.api_shapes import lines_as
from harness.workloads.generators import agent_sessions

HEADING = "## One agent workload through Chat Completions, Responses and Messages"
APIS = tuple(API_PATHS)


def _percentile(values: list[float], q: float) -> float | None:
    return float(np.percentile(np.asarray(values, dtype=float), q)) if values else None


def run_api(a: argparse.Namespace, api: str, lines, round_no: int) -> dict:
    """The workload's lines of one API on a fresh server; the run's figures."""
    port = free_port()
    args = ["--parallel", str(a.parallel), "--ctx-size", str(a.ctx_size), *shlex.split(a.server_args)]
    if a.threads:
        args += ["--threads", str(a.threads)]
    cmd = arbor_command(port, a.model, args)
    with running(f"api_parity_{api}_{round_no}", cmd, port, a.out / "logs") as srv:
        settings = ReplaySettings(base_url=srv.v1, concurrency=a.concurrency, progress=False,
                                  label=f"{api} (round {round_no})")
        result = asyncio.run(replay(lines, settings))
        stats = httpx.get(srv.base_url + "/cache/stats", timeout=60).json()
    path = result.save(a.out / "runs" / f"{api}-{round_no}.json")
    s = result.summary
    ttfts = [r.ttft_s for r in result.requests if r.ok and r.ttft_s is not None]
    ideal = s.get("ideal") or {}
    return {
        "api": api, "path": API_PATHS[api], "round": round_no, "command": shlex.join(cmd), "result": str(path),
        "requests": s["requests"], "errors": s["errors"],
        "errors_seen": sorted({r.error for r in result.requests if r.error})[:5],
        "prompt_tokens": s["tokens"]["prompt"], "cached_tokens": s["tokens"]["cached"],
        "computed_tokens": s["tokens"]["computed"], "completion_tokens": s["tokens"]["completion"],
        "prompt_tokens_per_request": [r.prompt_tokens for r in result.requests],
        "cached_tokens_per_request": [r.cached_tokens for r in result.requests],
        "completion_tokens_per_request": [r.completion_tokens for r in result.requests],
        "finish_reasons": [r.finish_reason for r in result.requests],
        "ideal_computed_tokens": ideal.get("ideal_computed_tokens"),
        "computed_over_ideal": ideal.get("computed_over_ideal"),
        "prompt_token_mismatches": ideal.get("prompt_token_mismatches"),
        "ttft_p50_s": _percentile(ttfts, 50), "ttft_p90_s": _percentile(ttfts, 90),
        "ttft_s": ttfts, "wall_s": s["wall_s"], "sources": s.get("cache_sources"),
        "reused_tokens_by_source": stats.get("reused_tokens_by_source"),
    }


def parity(runs: list[dict]) -> dict:
    """Whether every run computed the same prompt tokens, request by request; TTFT medians side by
    side with the spread between rounds of one API (the noise)."""
    per_api: dict[str, list[dict]] = {}
    for run in runs:
        per_api.setdefault(run["api"], []).append(run)
    prompts = {api: rs[0]["prompt_tokens_per_request"] for api, rs in per_api.items()}
    computed = {api: sorted({r["computed_tokens"] for r in rs}) for api, rs in per_api.items()}
    medians = {api: float(np.median([r["ttft_p50_s"] for r in rs if r["ttft_p50_s"] is not None]))
               for api, rs in per_api.items()}
    spread = {api: (max(r["ttft_p50_s"] for r in rs) - min(r["ttft_p50_s"] for r in rs)) if len(rs) > 1 else None
              for api, rs in per_api.items()}
    base = medians.get("chat")
    return {
        "same_prompt_tokens": len({json.dumps(p) for p in prompts.values()}) == 1,
        "same_computed_tokens": len({json.dumps(c) for c in computed.values()}) == 1,
        "computed_tokens": computed,
        "ttft_p50_median_s": medians,
        "ttft_p50_over_chat": {api: (m / base if base else None) for api, m in medians.items()},
        "ttft_p50_spread_between_rounds_s": spread,
    }


def interleaved(a: argparse.Namespace, requests: int) -> dict:
    """``requests`` single-turn agent requests, each with its own system prompt (so each computes its
    whole prompt), the APIs taking turns on one server: TTFT side by side under the same load."""
    work = agent_sessions(scenario=a.scenario, sessions=requests, turns=1, system_len=a.system_len // 3,
                          user_len=24, output_len=8, tool_call_len=8)
    lines = []
    for i, line in enumerate(work.lines):
        body = json.loads(json.dumps(line.body))
        body["messages"][0]["content"] = f"Case {i}. " + body["messages"][0]["content"]
        lines.append(lines_as([replace(line, session_id=f"case-{i}", body=body)], APIS[i % len(APIS)])[0])
    port = free_port()
    cmd = arbor_command(port, a.model, ["--parallel", str(a.parallel), "--ctx-size", str(a.ctx_size)])
    with running("api_parity_interleaved", cmd, port, a.out / "logs") as srv:
        result = asyncio.run(replay(lines, ReplaySettings(base_url=srv.v1, progress=False, ideal="off")))
    out: dict = {"command": shlex.join(cmd), "requests": {}}
    for api in APIS:
        rs = [r for r in result.requests if r.api == api]
        out["requests"][api] = [{"prompt_tokens": r.prompt_tokens, "cached_tokens": r.cached_tokens,
                                 "ttft_s": r.ttft_s, "error": r.error} for r in rs]
        out.setdefault("ttft_median_s", {})[api] = _percentile([r.ttft_s for r in rs if r.ttft_s is not None], 50)
    return out


def _commit() -> str | None:
    try:
        return subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True,
                              text=True, check=True).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return None


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--apis", default=",".join(APIS), help="comma list of: " + ", ".join(APIS))
    p.add_argument("--rounds", type=int, default=1, help="runs of each API, the order rotated each round")
    p.add_argument("--sessions", type=int, default=2)
    p.add_argument("--turns", type=int, default=3)
    p.add_argument("--system-len", type=int, default=600, help="words of the shared system prompt (the long prefix)")
    p.add_argument("--tool-result-len", type=int, default=80)
    p.add_argument("--output-len", type=int, default=16)
    p.add_argument("--scenario", default="edge_incident")
    p.add_argument("--model", type=Path, default=None, help="GGUF file (default: the embedded model)")
    p.add_argument("--parallel", type=int, default=2)
    p.add_argument("--ctx-size", type=int, default=8192)
    p.add_argument("--threads", type=int, default=0, help="--threads for the server (0: its default)")
    p.add_argument("--concurrency", type=int, default=1)
    p.add_argument("--server-args", default="", help="more arbor-server flags, one string")
    p.add_argument("--interleaved", type=int, default=0, metavar="N",
                   help="only the interleaved check: N one-turn requests of unshared prompts, the APIs taking "
                        "turns on one server (written to --out/interleaved.json)")
    p.add_argument("--out", type=Path, default=Path("bench/results/api_parity"))
    a = p.parse_args(argv)
    if a.interleaved:
        a.out.mkdir(parents=True, exist_ok=True)
        check = interleaved(a, a.interleaved)
        (a.out / "interleaved.json").write_text(json.dumps(check, indent=2) + "\n")
        print(json.dumps(check["ttft_median_s"], indent=2))
        return
    apis = [x for x in a.apis.split(",") if x]
    unknown = [x for x in apis if x not in APIS]
    if unknown or a.rounds < 1:
        p.error(f"unknown api {unknown}" if unknown else "--rounds must be at least 1")
    work = agent_sessions(scenario=a.scenario, sessions=a.sessions, turns=a.turns, system_len=a.system_len,
                          user_len=24, tool_result_len=a.tool_result_len, tool_call_len=a.output_len,
                          output_len=a.output_len)
    a.out.mkdir(parents=True, exist_ok=True)
    manifests = {api: lines_as(work.lines, api) for api in apis}
    for api, lines in manifests.items():
        write_manifest(lines, a.out / f"manifest-{api}.jsonl")
    from server.model_file import embedded_model_path

    index: dict = {"started": time.strftime("%Y-%m-%d %H:%M:%S"), "commit": _commit(),
                   "model": str(a.model or embedded_model_path()),
                   "command": "python -m bench.api_parity " + shlex.join(sys.argv[1:] if argv is None else argv),
                   "workload": "agent_sessions", "workload_params": work.describe()["params"],
                   "settings": {"parallel": a.parallel, "ctx_size": a.ctx_size, "concurrency": a.concurrency,
                                "rounds": a.rounds, "server_args": a.server_args}, "runs": []}
    for round_no in range(a.rounds):
        order = apis[round_no % len(apis):] + apis[:round_no % len(apis)]
        for api in order:
            run = run_api(a, api, manifests[api], round_no)
            index["runs"].append(run)
            print(f"{api:9s} round {round_no}: prompt={run['prompt_tokens']} computed={run['computed_tokens']} "
                  f"ideal={run['ideal_computed_tokens']} mismatches={run['prompt_token_mismatches']} "
                  f"TTFT p50={run['ttft_p50_s']:.3f}s p90={run['ttft_p90_s']:.3f}s wall={run['wall_s']:.1f}s "
                  f"errors={run['errors']}", flush=True)
    index["parity"] = parity(index["runs"])
    (a.out / "index.json").write_text(json.dumps(index, indent=2) + "\n")
    print(json.dumps(index["parity"], indent=2))
    print("wrote", a.out / "index.json")


def _f(x: float | None, nd: int = 2) -> str:
    return "–" if x is None else f"{x:.{nd}f}"


def report_section(res: Path) -> list[str]:
    """The docs/benchmarks.md section (bench/report.py) from api_parity/index.json."""
    out = [HEADING, ""]
    path = res / "api_parity" / "index.json"
    if not path.exists():
        return out + ["Not measured in this revision.", ""]
    index = json.loads(path.read_text())
    p, st = index["workload_params"], index["settings"]
    out += [f"Command: `{index['command']}` (started {index['started']}, {index.get('commit') or '?'}): the "
            f"`{index['workload']}` workload ({p['sessions']} sessions of {p['turns']} turns, a "
            f"{p['system_len']}-word system prompt and {p['tool_result_len']}-word tool results, "
            f"{p['output_len']} output tokens) generated as chat and translated into Responses and Messages bodies "
            "(`harness/workloads/api_shapes.py`), each replayed on a fresh arbor-server (default tiers, "
            f"`--parallel {st['parallel']}`, concurrency {st['concurrency']}, greedy, streamed); tokens from each "
            "API's own usage fields, TTFT at each API's first streamed content event.", "",
            "| API | round | prompt tokens | computed prompt tokens | computed/ideal | mismatches with /tokenize "
            "| TTFT p50 s | TTFT p90 s | wall s | sources | errors |",
            "|---|---|---|---|---|---|---|---|---|---|---|"]
    for run in index["runs"]:
        sources = ", ".join(f"{k}:{v}" for k, v in sorted((run.get("sources") or {}).items()))
        out.append(f"| {run['path']} | {run['round']} | {run['prompt_tokens']} | {run['computed_tokens']} | "
                   f"{_f(run['computed_over_ideal'])} | {run['prompt_token_mismatches']} | {_f(run['ttft_p50_s'], 3)} "
                   f"| {_f(run['ttft_p90_s'], 3)} | {_f(run['wall_s'], 1)} | {sources} | {run['errors']} |")
    par = index["parity"]
    ratios = ", ".join(f"{api} {_f(v)}" for api, v in par["ttft_p50_over_chat"].items())
    out += ["", f"Same prompt tokens on every request: **{'yes' if par['same_prompt_tokens'] else 'no'}**; "
            f"same computed tokens: **{'yes' if par['same_computed_tokens'] else 'no'}**. TTFT p50 over chat's: "
            f"{ratios}.", ""]
    return out


if __name__ == "__main__":
    main()
