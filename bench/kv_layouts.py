"""docs/benchmarks.md's section on the KV layouts (`--kv-layout`, issue 57) measured on the CPU: arbor-server's split
layout beside its unified one and stock llama-server's split and unified KV, at seed 002's shape, decode at several
stream counts and the agent workloads. The runs are bench.engine_throughput's and bench.run_all's, written under
bench/results/kv_layouts/ (the full commands are in the section):

    python -m bench.engine_throughput ... --arbor-layouts unified,split --out R/seed_shape_synth.json
    python -m bench.engine_throughput ... --arbor-layouts unified,split --out R/decode_synth.json
    python -m bench.run_all ... --out R/run_all          # R: bench/results/kv_layouts
"""

from __future__ import annotations

import statistics
from pathlib import Path

from bench.report_format import _f, _load, result_path
from harness.reports.results import load_results

HEADING = "## KV layouts on the CPU: split beside unified and llama-server"
READING_TOPIC = "KV layouts on the CPU"
DIR = "kv_layouts"
SPLIT = "llama-server (split KV)"


def _command(data: dict, out: str) -> str:
    st = data["settings"]
    flags = [f"--model {Path(data['model']).name}" if st.get("model") else "", f"--threads {st.get('threads')}",
             f"--parallel {st['parallel']}", f"--ctx-size {st['ctx_size']}", f"--streams {st['streams']}",
             f"--prompt-tokens {st['prompt_tokens']}" if st.get("prompt_tokens") else "",
             f"--max-tokens {st['max_tokens']}", f"--rounds {st['rounds']}", f"--repeat {st['repeat']}",
             f"--arbor-layouts {st['arbor_layouts']}" if st.get("arbor_layouts") else "",
             f"--arbor-flags '{st['arbor_flags']}'" if st.get("arbor_flags") else "",
             "--llama-server PATH", f"--out bench/results/{DIR}/{out}"]
    return "python -m bench.engine_throughput " + " ".join(f for f in flags if f)


def _engine_table(data: dict) -> list[str]:
    """One row per server and stream count, with the ratios to llama-server's split KV."""
    split = {x["concurrency"]: x for r in data["runs"] if r["name"] == SPLIT for x in r["levels"]}
    out = ["| server | streams | TTFT mean s | decode tok/s (samples) | round wall s | server CPU µs/token | decode / "
           "split | TTFT / split | wall / split |", "|---|---|---|---|---|---|---|---|---|"]
    for run in data["runs"]:
        for lv in run["levels"]:
            b = split.get(lv["concurrency"])

            def ratio(key, lv=lv, b=b):
                return _f(lv[key] / b[key]) if b and lv.get(key) and b.get(key) else "–"

            samples = ", ".join(f"{x:.0f}" for x in lv.get("decode_tok_s_samples", []))
            out.append(f"| {run['name']} | {lv['concurrency']} | {_f(lv['ttft_mean_s'])} | {_f(lv['decode_tok_s'], 1)} "
                       f"({samples}) | {_f(lv.get('round_wall_s'))} | {_f(lv.get('cpu_us_per_token'), 0)} | "
                       f"{ratio('decode_tok_s')} | {ratio('ttft_mean_s')} | {ratio('round_wall_s')} |")
    return out


def _agent_tables(index_dir: Path, index: dict) -> list[str]:
    """Per workload: each configuration's computed tokens against the ideal, its wall (the median over the rounds of
    its wall over the --no-cache wall of the round) and first tokens."""
    out = []
    by_load: dict[str, dict[str, list[dict]]] = {}
    for run in index["runs"]:
        by_load.setdefault(run["workload"], {}).setdefault(run["config"], []).append(run)
    checks = {(c["workload"], c["config"]): c for c in index.get("checks", [])}
    for workload, configs in by_load.items():
        rounds = len(next(iter(configs.values())))
        out += [f"**{workload}** ({rounds} round{'s' if rounds > 1 else ''}):", "",
                "| configuration | computed prompt tokens | computed/ideal | wall s (median) | wall x no-cache "
                "(rounds) | TTFT p50 s | sources |", "|---|---|---|---|---|---|---|"]
        for config, runs in configs.items():
            first = load_results(result_path(index_dir, runs[0]["result"])).summary
            ideal = first.get("ideal", {})
            check = checks.get((workload, config))
            ratio = "1.00" if config == "arbor --no-cache" else "–" if check is None else (
                f"{check['median']:.2f} ({', '.join(f'{x:.2f}' for x in check['wall_ratios'])})")
            sources = ", ".join(f"{k}:{v}" for k, v in sorted(first.get("cache_sources", {}).items()))
            out.append(f"| {config} | {first['tokens']['computed']} | {_f(ideal.get('computed_over_ideal'))} | "
                       f"{_f(statistics.median(r['wall_s'] for r in runs), 1)} | {ratio} | "
                       f"{_f(first['ttft_s'].get('p50'))} | {sources} |")
        out.append("")
    return out


def report_section(res: Path) -> list[str]:
    d = res / DIR
    out = [HEADING, ""]
    seed, decode = _load(d / "seed_shape_synth.json"), _load(d / "decode_synth.json")
    index = _load(d / "run_all" / "index.json")
    if seed is None and decode is None and index is None:
        return out + ["Not measured in this revision.", ""]
    out += ["arbor-server in each KV layout (`--kv-layout unified`, the CPU's `auto`, and `split`) beside stock "
            "llama-server's unified and split KV, every server with the same slots, cells and threads, in turns "
            "(`--repeat`: the medians; a sample per round in brackets).", ""]
    if seed is not None:
        out += [f"**Seed 002's shape, compute-light synthetic model** (`{_command(seed, 'seed_shape_synth.json')}`: "
                "8 concurrent requests, each its own long prompt):", "", *_engine_table(seed), ""]
    if decode is not None:
        out += [f"**Decode at {decode['settings']['streams']} streams** (`{_command(decode, 'decode_synth.json')}`: "
                "one-line prompts, more streams than slots queue):", "", *_engine_table(decode), ""]
    if index is not None:
        out += [f"**The agent workloads** (`{index['command']}`, model `{Path(index['model']).name}`; the same prompts "
                "for every server; `arbor --no-cache` is the CPU's `auto` layout, unified):", "",
                *_agent_tables(d / "run_all", index)]
    return out + [""]
