"""docs/benchmarks.md's section on the eviction policies (issue 58): the simulator's bound
(bench/cache_sim.py, cache_sim.json), the real server's runs beside it (bench/cache_policy.py,
cache_policy.json) and one restore beside a decode, staged, in pieces or whole (bench/restore_beside.py,
restore_beside.json). bench/report.py calls `report_section`."""

from __future__ import annotations

from pathlib import Path

from bench.report_format import _f, _load

HEADING = "## Eviction policies against the bound"
READING_TOPIC = "Eviction policies and the bound"

SIM_ROWS = (("ideal", "the workload's ideal"), ("lru", "lru"), ("lifecycle", "lifecycle (the hints' classes)"),
            ("predictive_online", "predictive, online only"), ("predictive", "predictive, with priors"),
            ("predictive_prefetch", "predictive, with priors and prefetch"),
            ("belady", "Bélády's rule (the bound)"))


def sim_table(data: dict) -> list[str]:
    t, b = data["trace"], data["budgets"]
    ideal, bound = data["ideal"], data["bound"]
    out = [f"Simulator (`{data['command']}`): {t['requests']} requests of {t['sessions']} cache sessions, "
           f"{t['prompt_tokens']} prompt {t['unit']}, {data['schedule']}; device {b['device_cells']} cells kept "
           f"beyond running requests, host {b['host_bytes'] >> 20} MiB at {b['bytes_per_token']} bytes per token; "
           f"priors: {data.get('priors') or 'none'}.", "",
           "| policy | computed | x ideal | x bound | restored from H when admitted | prefetched (used / unused) |",
           "|---|---|---|---|---|---|"]
    for key, name in SIM_ROWS:
        r = data["results"].get(key, {})
        value = ideal if key == "ideal" else r.get("computed")
        if value is not None:
            pf = r.get("prefetch")
            prefetched = f"{pf['prefetched']} ({pf['hits']} / {pf['misses']})" if pf else "-"
            restored = r.get("reused_by_tier", {}).get("H", 0) if key != "ideal" else "-"
            out.append(f"| {name} | {value} | {_f(value / ideal)} | {_f(value / bound)} | {restored} | "
                       f"{prefetched} |")
    return out + [""]


def real_table(data: dict) -> list[str]:
    w = data["workload"]
    waits = w.get("tool_wait_s")
    args = " ".join(w.get("server_args") or [])
    flag = f" --tool-wait {waits[0]},{waits[1]}" if waits else ""
    taking = f", each tool call taking {waits[0]}-{waits[1]} s" if waits else ""
    out = [f"Real server (`python -m bench.cache_policy{flag}`): {w['requests']} requests ({w['sessions']} sessions, "
           f"{w['turns']} turns, {w['branches']} branches after {w['fork_after']}{taking}), concurrency "
           f"{data['concurrency']}, `--cache-ram {data['cache_ram_mib']}{' ' + args if args else ''}`, "
           "a fresh server per policy, one run each on a shared, noisy machine; `bound` and `simulated` are the "
           "simulator's on the server's tokens in the order that run admitted its requests; the restore stall is the "
           "engine's longest step of restore pieces (or, staged, of cells taken) beside computing requests, next to "
           "the mean llama_decode call "
           "(prefill chunks and decode steps)."
           + (" A policy named `@MiB` ran with a host tier of that size instead (its bound and simulation too)."
              if any("@" in r["policy"] for r in data["runs"]) else ""), "",
           "| policy | computed | ideal | bound | real / bound | simulated | wall s | TTFT p50 s | "
           "TTFT p50 after a tool wait s | prefetched (used / unused) | restore stall ms | mean llama_decode ms |",
           "|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in data["runs"]:
        sim = r.get("sim") or {}
        bound = sim.get("bound")
        pf = r.get("prefetch") or {}
        prefetched = f"{pf['prefetched_tokens']} ({pf['hit_tokens']} / {pf['miss_tokens']})" if pf.get("enabled") \
            else "-"
        stall = (r.get("max_step_cache_ms_by_kind") or {}).get("restore")
        out.append(f"| {r['policy']} | {r['computed']} | {r['ideal']} | {bound} | "
                   f"{_f(r['computed'] / bound) if bound else '-'} | {sim.get('simulated')} | {_f(r['wall_s'], 1)} | "
                   f"{_f(r['ttft_p50_s'], 3)} | {_f(r['ttft_p50_after_tool_wait_s'], 3)} | {prefetched} | "
                   f"{_f(stall, 1) if stall is not None else '-'} | {_f(r.get('decode_step_ms_mean'), 1)} |")
    return out + [""]


def report_section(res: Path) -> list[str]:
    out = [HEADING, ""]
    sim, real = _load(res / "cache_sim.json"), _load(res / "cache_policy.json")
    waits = _load(res / "cache_policy_tool_waits.json")
    if sim is None and real is None and waits is None:
        return out + ["Not measured in this revision (bench/results/cache_sim.json, cache_policy.json and "
                      "cache_policy_tool_waits.json are missing).", ""]
    if sim is not None:
        out += sim_table(sim)
    for data in (real, waits):
        if data is not None:
            out += real_table(data)
    beside = _load(res / "restore_beside.json")
    if beside is not None:
        out += beside_table(beside)
    return out


def beside_table(data: dict) -> list[str]:
    """bench.restore_beside: per mode, the engine thread's longest restore step and the two requests' figures."""
    runs = data["runs"]
    out = [f"One restore beside a decode (`{data['command']}`): a {runs[0]['prompt_tokens']}-token prompt restored "
           f"from host RAM while another request decodes, {data['rounds']} restores on each of {data['repeats']} "
           "fresh servers per mode, in turns; `first` is a server's first restore, `later` the others.", "",
           "| mode | engine thread's longest restore step ms | restored TTFT ms, first | restored TTFT ms, later | "
           "decoding request's longest gap while it restored ms | its median gap before ms |",
           "|---|---|---|---|---|---|"]
    for mode in dict.fromkeys(r["mode"] for r in runs):
        mine = [r for r in runs if r["mode"] == mode]
        kind = "admission" if mode == "whole" else "restore"  # a whole restore runs at admission
        step = max(r["max_step_cache_ms_by_kind"].get(kind, 0.0) for r in mine)

        def span(rows: list[dict], key: str) -> str:
            vals = [r[key] for r in rows if r[key] is not None]
            return f"{_f(min(vals), 1)}–{_f(max(vals), 1)}" if vals else "-"

        out.append(f"| {mode} | {_f(step, 1)} ({kind}) | {span([r for r in mine if r['round'] == 0], 'ttft_ms')} | "
                   f"{span([r for r in mine if r['round'] > 0], 'ttft_ms')} | "
                   f"{span(mine, 'decode_gap_ms_max_during')} | {span(mine, 'decode_gap_ms_median_before')} |")
    return out + [""]
