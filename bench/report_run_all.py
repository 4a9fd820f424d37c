"""docs/benchmarks.md's sections of `python -m bench.run_all` (every configuration side by side, on each model
bench/results/ has a run for): bench/report.py calls `run_all_section` for each of RUN_ALL_DIRS."""

from __future__ import annotations

from pathlib import Path

from bench.report_format import _f, _load, result_path
from harness.reports.results import load_results

RUN_ALL_DIRS = {
    "run_all": ("Workloads: every configuration side by side",
                "python -m bench.run_all --quick"),
    "run_all_synth": ("Workloads on a compute-light synthetic model (llama, 4 layers, 256 wide, q8_0)",
                      "python -m bench.synth_model --shape custom --arch llama --n-layer 4 --n-embd 256 --n-head 4 "
                      "--n-head-kv 2 --n-ff 512 --type q8_0 --out var/models/llama-4x256-synth.q8_0.gguf && "
                      "python -m bench.run_all --quick --model var/models/llama-4x256-synth.q8_0.gguf "
                      "--out bench/results/run_all_synth"),
    "run_all_swa": ("Workloads on a sliding-window model (Gemma 3 shape, 6 layers of 1024, window 512, q8_0)",
                    "python -m bench.synth_swa_hybrid --arch gemma3 --shape bench --tokenizer smollm2 --n-layer 6 "
                    "--out var/models/gemma3-swa-bench6.gguf && python -m bench.run_all --quick --same-prompts "
                    "--model var/models/gemma3-swa-bench6.gguf --out bench/results/run_all_swa"),
    "run_all_hybrid": ("Workloads on a hybrid model (LFM2 shape, 6 layers of 1024: 4 conv, 2 attention, q8_0)",
                       "python -c \"from pathlib import Path; from harness.models.synth_swa_hybrid import shape_for, "
                       "write_model; write_model(shape_for('lfm2', 'bench', n_layer=6, attn_layers=(2, 5)), "
                       "Path('var/models/lfm2-hybrid-bench6.gguf'))\" && python -m bench.run_all --quick "
                       "--same-prompts --model var/models/lfm2-hybrid-bench6.gguf --out bench/results/run_all_hybrid"),
}


def run_all_section(res: Path, dirname: str = "run_all") -> list[str]:
    title, command = RUN_ALL_DIRS[dirname]
    index = _load(res / dirname / "index.json")
    if index is not None and index.get("command"):
        command = index["command"]
    out = [f"## {title}", "",
           f"Command: `{command}` (concurrency 4; a fresh server per workload and "
           "configuration; ideal computed on the server's own tokens). "
           "`computed/ideal` is the cache's score (1.00 is perfect); ratios are against `arbor --no-cache` "
           "in the same run. `cache/decode` is the engine-thread time spent in the cache (routing, restores, "
           "write-back; from /cache/stats) over the decode time of the run (target ≤ 5%), with the longest such "
           "work inside one decoding step where the server reports it.", ""]
    if index is None:
        return out + ["Not measured in this revision.", ""]
    out += [f"Started {index['started']}, model `{Path(index['model']).name}`.", ""]
    checks = {(c["workload"], c["config"]): c for c in index.get("checks", [])}
    rounds = max((r.get("round", 1) for r in index["runs"]), default=1)
    if checks:
        out += [f"The check against `--no-cache` ({rounds} round{'s' if rounds > 1 else ''}, all configurations in "
                "each): `wall (x no-cache)` is the median over the rounds of each run's wall over the `--no-cache` "
                "wall of its round (the rounds' ratios in brackets); **slower** marks a median above 1 + noise, the "
                "noise being the spread of the `--no-cache` walls over the rounds (at least 0.05). The other "
                "columns are the first round's.", ""]
        slower = [f"{c['workload']} / {c['config']} ({c['median']:.2f}, noise {c['noise']:.2f})"
                  for c in checks.values() if c["slower"]]
        noisiest = max(c["noise"] for c in checks.values())
        out += ["Slower than `--no-cache` beyond noise: " + ("; ".join(slower) if slower else "none") + "."
                + (f" The noise reached {noisiest:.2f} in this run (the `--no-cache` walls alone varied that much): "
                   "a difference smaller than that is not seen." if noisiest > 0.2 else ""), ""]
    by_load: dict[str, list[dict]] = {}
    for run in index["runs"]:
        if run.get("round", 1) == 1:
            by_load.setdefault(run["workload"], []).append(run)
    for wname, runs in by_load.items():
        out += [f"### {wname}", "", "| configuration | computed prompt tokens | computed/ideal | wall (x no-cache) "
                "| TTFT p50 (x no-cache) | TTFT mean (x no-cache) | prefill s / decode s | cache/decode | sources |",
                "|---|---|---|---|---|---|---|---|---|"]
        base = None
        rows = []
        for run in runs:
            s = load_results(result_path(res / dirname, run["result"])).summary
            if run["config"] == "arbor --no-cache":
                base = s
            rows.append((run["config"], s, run.get("engine_thread")))
        for name, s, eng in rows:
            ideal = s.get("ideal", {})

            def rel(key, sub=None, s=s, base=base):
                a = s[key] if sub is None else s[key].get(sub)
                b = None if base is None else (base[key] if sub is None else base[key].get(sub))
                return _f(a / b) if a and b else "–"

            check = checks.get((wname, name))
            wall = rel("wall_s") if check is None else (
                f"{check['median']:.2f} [{', '.join(f'{x:.2f}' for x in check['wall_ratios'])}]"
                + (" **slower**" if check["slower"] else ""))
            out.append(f"| {name} | {s['tokens']['computed']} | {_f(ideal.get('computed_over_ideal'))} | "
                       f"{_f(s['wall_s'], 1)} s ({wall}) | {rel('ttft_s', 'p50')} | {rel('ttft_s', 'mean')} "
                       f"| {_halves(s)} | {_share(eng)} "
                       f"| {', '.join(f'{k}:{v}' for k, v in sorted(s.get('cache_sources', {}).items()))} |")
        out.append("")
    return out


def _halves(summary: dict) -> str:
    """A run's requests' time to their first token and after it, summed (its prefill and decode halves)."""
    if "decode_s" not in summary:
        return "–"
    return f"{_f(summary['prefill_s'], 1)} / {_f(summary['decode_s'], 1)}"


def _share(eng: dict | None) -> str:
    if not eng or not eng.get("decode_ms"):
        return "–"
    share = f"{100 * eng['cache_ms'] / eng['decode_ms']:.1f}%"
    if eng.get("max_step_cache_ms"):  # the longest cache work inside one decoding step
        share += f" (≤ {eng['max_step_cache_ms']:.1f} ms/step)"
    return share
