"""Regenerate docs/benchmarks.md from the raw results under bench/results/.

    python -m bench.report [--results bench/results] [--out docs/benchmarks.md]

Only what was measured is reported; a missing result file becomes a line saying so.
"""

from __future__ import annotations

import argparse
import json
import platform
import subprocess
from pathlib import Path

from app.replay.results import load_results


def _load(path: Path) -> dict | None:
    return json.loads(path.read_text()) if path.exists() else None


def _f(x, nd=2) -> str:
    return "–" if x is None else (f"{x:.{nd}f}" if isinstance(x, float) else str(x))


def machine() -> str:
    cpu = "unknown CPU"
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    cores = subprocess.run(["nproc"], capture_output=True, text=True).stdout.strip()
    return f"{cpu}, {cores} cores, {platform.platform()}"


def engine_section(res: Path) -> list[str]:
    data = _load(res / "engine_throughput.json")
    out = ["## Engine: decode throughput and TTFT", "",
           "Command: `python -m bench.engine_throughput` (arbor-server with `--no-cache`, `--parallel` slots, "
           "`--max-tokens` per request, `ignore_eos`, greedy; distinct short prompts; the exact command of each "
           "server is in the result file).", ""]
    if data is None:
        return out + ["Not measured in this revision (bench/results/engine_throughput.json is missing).", ""]
    out += ["| server | concurrency | decode tok/s | TTFT p50 s | TTFT mean s |", "|---|---|---|---|---|"]
    for run in data["runs"]:
        for lv in run["levels"]:
            out.append(f"| {run['name']} | {lv['concurrency']} | {_f(lv['decode_tok_s'], 1)} | "
                       f"{_f(lv['ttft_p50_s'])} | {_f(lv['ttft_mean_s'])} |")
    inproc = _load(res / "engine_inprocess.json")
    if inproc is not None:
        out += ["", "The engine alone, without HTTP (`python -m bench.engine_inprocess`, same settings, run "
                    "separately): " + ", ".join(f"{lv['decode_tok_s']:.1f} tok/s at {lv['concurrency']}"
                                                for lv in inproc["levels"]) + "."]
    if not data.get("llama_server"):
        out += ["", "Stock llama-server was not installed when this ran, so there is no side-by-side row "
                    "(see 'What is missing')."]
    return out + [""]


def unified_section(res: Path) -> list[str]:
    data = _load(res / "unified_vs_split.json")
    out = ["## Unified KV against split streams", "",
           "Command: `python -m bench.unified_vs_split` (bare llama_decode loop, 4 sequences, 64-token prompts, "
           "20 decode steps, best of 3 interleaved repeats).", ""]
    if data is None:
        return out + ["Not measured in this revision.", ""]
    b = data["best_tok_s"]
    out += ["| KV | decode tok/s |", "|---|---|", f"| unified | {_f(b['unified'], 1)} |",
            f"| split | {_f(b['split'], 1)} |", "",
            f"Unified / split = **{_f(data['unified_over_split'])}**.", ""]
    return out


def cache_micro_section(res: Path) -> list[str]:
    data = _load(res / "cache_micro.json")
    out = ["## Cache micro-benchmarks", "", "Command: `python -m bench.cache_micro`.", ""]
    if data is None:
        return out + ["Not measured in this revision.", ""]
    if "device_kv" in data:
        d = data["device_kv"]
        out += [f"- **Device KV** ({d['requests']} concurrent requests, {d['prompt_tokens']}-token prompts sharing "
                f"their first half): {d['used_cells']} cells used, union bound {d['union_bound']}, "
                f"{d['no_sharing_cells']} without sharing: cells/bound = **{_f(d['cells_over_bound'], 3)}** "
                f"(target ≤ 1.02), reduction **{_f(100 * d['reduction_vs_no_sharing'], 1)}%** (target 37.5%). "
                f"Sources: {', '.join(d['sources'])}."]
    if "host_bytes" in data:
        h = data["host_bytes"]
        out += [f"- **Host bytes** ({h['prompts']} prompts of {h['prompt_tokens']} tokens sharing their first half):"
                f" {h['host_bytes']} bytes in tier H, bound {int(h['union_bound_bytes'])}, per-sequence snapshots "
                f"{h['per_sequence_snapshot_bytes']}: bytes/bound = **{_f(h['bytes_over_bound'], 3)}** "
                f"(target ≤ 1.02), reduction **{_f(100 * h['reduction_vs_snapshots'], 1)}%** (target 43.75%)."]
    if "restore_vs_recompute" in data:
        r = data["restore_vs_recompute"]
        out += [f"- **Restore vs recompute** ({r['tokens']} tokens, {r['bytes']} bytes of KV): recompute "
                f"{_f(r['recompute_s'], 3)} s, host restore {_f(r['host_restore_s'], 3)} s, disk restore "
                f"{_f(r['disk_restore_s'], 3)} s: **{_f(r['host_speedup'], 1)}x** from host (target ≥ 20x), "
                f"**{_f(r['disk_speedup'], 1)}x** from disk (target ≥ 5x)."]
    return out + [""]


def run_all_section(res: Path) -> list[str]:
    index = _load(res / "run_all" / "index.json")
    out = ["## Workloads: every configuration side by side", "",
           "Command: `python -m bench.run_all --quick` (concurrency 4; a fresh server per workload and "
           "configuration; ideal computed on the server's own tokens). "
           "`computed/ideal` is the cache's score (1.00 is perfect); ratios are against `arbor --no-cache` "
           "in the same run.", ""]
    if index is None:
        return out + ["Not measured in this revision.", ""]
    by_load: dict[str, list[dict]] = {}
    for run in index["runs"]:
        by_load.setdefault(run["workload"], []).append(run)
    for wname, runs in by_load.items():
        out += [f"### {wname}", "", "| configuration | computed prompt tokens | computed/ideal | wall (x no-cache) "
                "| TTFT p50 (x no-cache) | TTFT mean (x no-cache) | sources |", "|---|---|---|---|---|---|---|"]
        base = None
        rows = []
        for run in runs:
            s = load_results(run["result"]).summary
            if run["config"] == "arbor --no-cache":
                base = s
            rows.append((run["config"], s))
        for name, s in rows:
            ideal = s.get("ideal", {})

            def rel(key, sub=None):
                a = s[key] if sub is None else s[key].get(sub)
                b = None if base is None else (base[key] if sub is None else base[key].get(sub))
                return _f(a / b) if a and b else "–"

            out.append(f"| {name} | {s['tokens']['computed']} | {_f(ideal.get('computed_over_ideal'))} | "
                       f"{_f(s['wall_s'], 1)} s ({rel('wall_s')}) | {rel('ttft_s', 'p50')} | {rel('ttft_s', 'mean')} "
                       f"| {', '.join(f'{k}:{v}' for k, v in sorted(s.get('cache_sources', {}).items()))} |")
        out.append("")
    return out


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--results", type=Path, default=Path("bench/results"))
    p.add_argument("--out", type=Path, default=Path("docs/benchmarks.md"))
    p.add_argument("--notes", type=Path, default=Path("bench/NOTES.md"),
                   help="hand-written analysis appended as is")
    a = p.parse_args(argv)
    lines = ["# Benchmarks", "", "Generated by `python -m bench.report` from `bench/results/` (raw JSON, not "
             "committed). All figures come from one machine, measured side by side; the machine is shared and "
             "noisy, so compare ratios within a table, not absolute numbers across tables.", "",
             f"Machine: {machine()}. Model: the embedded SmolLM2-135M-Instruct Q4_1.", ""]
    for section in (engine_section, unified_section, cache_micro_section, run_all_section):
        lines += section(a.results)
    if a.notes.exists():
        lines += [a.notes.read_text().rstrip(), ""]
    a.out.parent.mkdir(parents=True, exist_ok=True)
    a.out.write_text("\n".join(lines))
    print("wrote", a.out)


if __name__ == "__main__":
    main()
