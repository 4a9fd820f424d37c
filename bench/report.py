"""Regenerate docs/benchmarks.md from the raw results under bench/results/.

    python -m bench.report [--results bench/results] [--out docs/benchmarks.md] [--device-results OUT/results.tgz]

Only what was measured is reported; a section whose result file is missing keeps its figures from the
previous docs/benchmarks.md (marked as carried over), or becomes a line saying so. The tables are all
this writes: what they mean, what is not done and the figures measured by hand are in
docs/benchmark-notes.md, which each section points to.
"""

from __future__ import annotations

import argparse
import platform
import re
import subprocess
from pathlib import Path

import bench.kv_layouts as kv_layouts
from bench import (
    api_parity,
    checkpoint_agreement,
    kv_types,
    paged_logits,
    report_cache,
    speculative,
    story_run,
    swa_memory,
)
from bench.device_results import unpack as unpack_device_results
from bench.report_format import _f, _load
from bench.report_run_all import RUN_ALL_DIRS, run_all_section
from bench.report_serving import (
    hostile_section,
    loop_latency_section,
    n_choices_section,
    soak_section,
    tree_evict_section,
)
from harness.kernels import paged_kernel_check


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
    return f"{cpu}, {cores} cores, {platform.platform()}{gpu()}"


def gpu() -> str:
    """', GPU name' when nvidia-smi names one (a GPU host), else ''."""
    try:
        names = subprocess.run(["nvidia-smi", "--query-gpu=name", "--format=csv,noheader"],
                               capture_output=True, text=True, timeout=20).stdout.split("\n")
    except (OSError, subprocess.SubprocessError):
        return ""
    names = [n.strip() for n in names if n.strip()]
    return f", {len(names)} x {names[0]}" if names else ""


def engine_section(res: Path) -> list[str]:
    data = _load(res / "engine_throughput.json")
    out = ["## Engine: decode throughput and TTFT", "",
           "Command: `python -m bench.engine_throughput` (`--parallel` slots, `--max-tokens` per request, "
           "`ignore_eos`, greedy; distinct short prompts; each server with its default prompt cache unless the "
           "command says `--no-cache`; the exact command of each server is in the result file).", ""]
    if data is None:
        return out + ["Not measured in this revision (bench/results/engine_throughput.json is missing).", ""]
    st = data.get("settings", {})
    out += [f"Model `{Path(data['model']).name}`; every server with --parallel {st.get('parallel')}, --ctx-size "
            f"{st.get('ctx_size')}, --threads {st.get('threads')}, --n-gpu-layers {st.get('n_gpu_layers')}, "
            f"{data.get('max_tokens')} tokens per stream.", ""]
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
            f"| split | {_f(b['split'], 1)} |"]
    if "unified_paged" in b:
        out += [f"| unified + paged attention ({data.get('page_size')}-cell pages) | {_f(b['unified_paged'], 1)} |"]
    out += ["", f"Unified / split = **{_f(data['unified_over_split'])}**."]
    if "unified_paged_over_split" in data:
        out += [f"Unified + paged / split = **{_f(data['unified_paged_over_split'])}**."]
    return out + [""]


def cache_micro_section(res: Path) -> list[str]:
    data = _load(res / "cache_micro.json")
    out = ["## Cache micro-benchmarks", "", "Command: `python -m bench.cache_micro`.", ""]
    if data is None:
        return out + ["Not measured in this revision.", ""]
    if data.get("model") not in (None, "embedded"):
        out += [f"Model `{Path(data['model']).name}`, --n-gpu-layers {data.get('n_gpu_layers')}.", ""]
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
        gbs = lambda k: _f(r.get(k, 0) / 1e9, 2)  # noqa: E731
        out += [f"- **Store and restore** ({r['tokens']} tokens, {r['bytes']} bytes of KV, "
                f"{r['bytes_per_token']} bytes/token; best of 5): recompute {_f(r['recompute_s'], 3)} s "
                f"({_f(r['recompute_tokens_per_s'], 0)} tok/s); host store {_f(r['host_store_s'], 4)} s = "
                f"**{gbs('host_store_bytes_per_s')} GB/s**; host restore {_f(r['host_restore_s'], 4)} s = "
                f"**{gbs('host_restore_bytes_per_s')} GB/s** (as two segments, joined: "
                f"{gbs('host_restore_joined_bytes_per_s')} GB/s); disk restore {_f(r['disk_restore_s'], 4)} s = "
                f"{gbs('disk_restore_bytes_per_s')} GB/s (target ≥ 1 GB/s for host store and restore). "
                f"Restoring beats recomputing **{_f(r['host_restore_speedup_vs_recompute'], 1)}x** from host, "
                f"**{_f(r['disk_restore_speedup_vs_recompute'], 1)}x** from disk."]
    return out + [""]


def idle_cells_section(res: Path) -> list[str]:
    data = _load(res / "idle_cells.json")
    out = ["## What idle KV cells cost the running requests", "",
           "Command: `python -m bench.idle_cells` (bare llama_decode loop, unified KV: one sequence's prefill and "
           "decode with the KV otherwise empty, then with other sequences holding idle cells; best of 3).", ""]
    if data is None:
        return out + ["Not measured in this revision.", ""]
    runs = data.get("runs") or [dict(data, page_size=0)]  # older files: one unpaged run
    out += [f"Model `{Path(data['model']).name}`, --n-gpu-layers {data['n_gpu_layers']}, {runs[0]['idle_cells']} "
            "idle cells.", "", "| attention | | KV otherwise empty | with the idle cells | slowdown |",
            "|---|---|---|---|---|"]
    names = {"prefill_0_512_ms": "prefill, tokens 0-512 (ms)", "prefill_512_1024_ms": "prefill, tokens 512-1024 (ms)",
             "decode_step_ms": "one decode step (ms)"}
    for run in runs:
        kind = f"paged, {run['page_size']}-cell pages" if run["page_size"] else "every cell (unpaged)"
        e, h, x = run["empty"], run["with_idle_cells"], run["slowdown"]
        for k, label in names.items():
            out.append(f"| {kind} | {label} | {_f(e[k], 1)} | {_f(h[k], 1)} | {_f(x[k])}x |")
    return out + [""]


SEED_SHAPE_FILES = {"seed_shape_synth.json": "compute-light synthetic model",
                    "seed_shape_embedded.json": "embedded model",
                    "seed_shape_gpu.json": "GPU host (bench/device_suite.sh)"}


def _variant_flags(settings: dict) -> str:
    """The arbor-server variants a bench.engine_throughput run added, as its command line named them."""
    flags = {"arbor_unpaged": "--arbor-unpaged", "arbor_paged": "--arbor-paged",
             "arbor_shared_pages": "--arbor-shared-pages"}
    return "".join(f" {flag}" for key, flag in flags.items() if settings.get(key))


def paged_section(res: Path, pointers: bool = True) -> list[str]:
    """Paged attention (issue 22): the seed's shape scaled to this machine, the synthetic model's idle-cell
    and unified/split figures (the embedded model's are in the sections above), the paged/unpaged agreement.
    `pointers=False` leaves out the line that points to the design and to the CPU sections above it."""
    out = ["## Paged attention against unpaged and stock llama-server", ""]
    if pointers:
        out += ["Design and patch files: `docs/paged-attention.md`. The embedded model's idle-cell and unified/split "
                "figures are in the two sections above.", ""]
    found = False
    for name, label in SEED_SHAPE_FILES.items():
        data = _load(res / name)
        if data is None:
            continue
        found = True
        st = data["settings"]
        out += [f"**Seed 002's shape, {label}** (`python -m bench.engine_throughput --parallel {st['parallel']} "
                f"--ctx-size {st['ctx_size']} --streams {st['streams']} --prompt-tokens {st['prompt_tokens']} "
                f"--max-tokens {st['max_tokens']} --repeat {st['repeat']}{_variant_flags(st)}`, model "
                f"`{Path(data['model']).name}`: concurrent requests with unique prompts, medians):", "",
                "| server | streams | prompt tokens | TTFT mean s | decode tok/s |", "|---|---|---|---|---|"]
        for run in data["runs"]:
            for lv in run["levels"]:
                out.append(f"| {run['name']} | {lv['concurrency']} | {_f(lv.get('prompt_tokens_mean'), 0)} | "
                           f"{_f(lv['ttft_mean_s'])} | {_f(lv['decode_tok_s'], 1)} |")
        out.append("")
    synth = _load(res / "idle_cells_synth.json")
    if synth is not None:
        found = True
        out += [f"**Idle cells, synthetic model** (`python -m bench.idle_cells --model {Path(synth['model']).name} "
                "--page-size 0,16`): slowdown of one request with 12,000 cells held by other sequences.", "",
                "| attention | prefill 0-512 | prefill 512-1024 | decode step |", "|---|---|---|---|"]
        for run in synth["runs"]:
            x = run["slowdown"]
            kind = f"paged ({run['page_size']}-cell pages)" if run["page_size"] else "unpaged"
            out.append(f"| {kind} | {_f(x['prefill_0_512_ms'])}x | {_f(x['prefill_512_1024_ms'])}x | "
                       f"{_f(x['decode_step_ms'])}x |")
        out.append("")
    uvs = _load(res / "unified_vs_split_synth.json")
    if uvs is not None and "unified_paged" in uvs["best_tok_s"]:
        found = True
        b = uvs["best_tok_s"]
        shared = ""
        if "unified_paged_shared_pages" in b:  # owned pages turned off (llama.cpp's placement), beside it
            shared = (f"; paged with llama.cpp's placement (decode tokens of all sequences sharing pages) "
                      f"{_f(b['unified_paged_shared_pages'], 0)} ({_f(uvs['unified_paged_shared_pages_over_split'])}x)")
        out += [f"**Unified against split, synthetic model** (`python -m bench.unified_vs_split --model "
                f"{Path(uvs['model']).name} --seqs {uvs['seqs']} --tokens {uvs['tokens']} --prompt {uvs['prompt']}`, "
                f"best of {len(uvs['tok_s']['split'])} interleaved repeats): split {_f(b['split'], 0)} tok/s, "
                f"unified {_f(b['unified'], 0)} ({_f(uvs['unified_over_split'])}x), unified + paged with owned pages "
                f"{_f(b['unified_paged'], 0)} (**{_f(uvs['unified_paged_over_split'])}x**){shared}.", ""]
    agree = _load(res / "paged_agreement.json")
    if agree is not None:
        found = True
        out += [f"**Agreement** (`python -m bench.paged_agreement`, --n-gpu-layers {agree['n_gpu_layers']}): "
                f"{agree['predictions']} teacher-forced top-1 predictions, paged = unpaged for "
                f"**{_f(100 * agree['agreement'], 2)}%**.", ""]
    if not found:
        out.append("Not measured in this revision.")
    return out + [""]


DEVICE_HEADING = "## On a GPU host: the paged kernels, the seed shape and the engine (bench/device_suite.sh)"
DEVICE_DIR = "device"  # bench/results/device/: what a device run's results.tgz holds under results/


def _demoted(section: list[str]) -> list[str]:
    """A section of its own as a part of another: its '## ' heading one level down, its pointer dropped."""
    body = [line for line in section if not line.startswith(READING_PREFIX)]
    return ["#" + body[0], *body[1:]]


def device_section(res: Path) -> list[str]:
    """The GPU host's figures (bench/device_suite.sh, issues 11 and 33), from bench/results/device/: the paged kernels
    against the dense ones and under compute-sanitizer, seed 002's shape, idle cells and agreement with paging on the
    GPU, decode at 1/4/16 streams. Each part as its own section renders it, one level down."""
    d = res / DEVICE_DIR
    out = [DEVICE_HEADING, ""]
    if not d.is_dir():
        return out + ["Not measured in this revision.", ""]
    note = d / "README.md"  # what ran where: the host, the build, which run gave which file
    if note.exists():
        out += [note.read_text().strip(), ""]
    if (d / "paged_kernel_check.json").exists():
        out += _demoted(paged_kernel_check.report_section(d))
    sanitizer = _load(d / "paged_kernel_sanitizer.json")
    if sanitizer is not None:
        n = len(sanitizer["cases"])
        out += ["", f"Under `compute-sanitizer --tool memcheck` (`--quick`): {n - sanitizer['failed']} of {n} cases "
                    "passed (memcheck's own verdict is in the run's log, not in this file).", ""]
    if (d / "seed_shape_gpu.json").exists() or (d / "paged_agreement.json").exists():
        out += _demoted(paged_section(d, pointers=False))
    if (d / "idle_cells.json").exists():
        out += _demoted(idle_cells_section(d))
    if (d / "engine_throughput.json").exists():
        out += _demoted(engine_section(d))
    if (d / "run_all" / "index.json").exists():  # the agent workload (issue 57)
        out += _demoted(run_all_section(d, "run_all"))
    return out + [""]


PAGED_LOGITS_HEADING = "## Paged attention, logit by logit"


def paged_logits_section(res: Path) -> list[str]:
    """bench/paged_logits.py's table (issue 33, item 6), a section of its own so that measuring it
    alone does not drop the paged section's other figures (carried over when not re-measured)."""
    return [PAGED_LOGITS_HEADING, "", *(paged_logits.report_lines(res) or ["Not measured in this revision.", ""])]


READING = Path("docs/benchmark-notes.md")
READING_PREFIX = "Reading these figures: "

# Each generated section (by its heading) and the heading of docs/benchmark-notes.md that reads it.
READING_TOPICS = {
    "## Engine: decode throughput and TTFT": "Engine throughput and TTFT",
    "## Unified KV against split streams": "Unified KV against split streams",
    kv_layouts.HEADING: kv_layouts.READING_TOPIC,
    "## What idle KV cells cost the running requests": "Idle cells and paged attention",
    "## Paged attention against unpaged and stock llama-server": "Idle cells and paged attention",
    "## Cache micro-benchmarks": "Cache micro-benchmarks",
    "## Workloads: every configuration side by side": "Workloads side by side",
    "## Workloads on a compute-light synthetic model": "The compute-light synthetic model",
    "## n choices from one prompt": "n choices from one prompt",
    "## Soak: mixed traffic for a long time": "Soak",
    "## /metrics and /health while the cache stores large KV": "/metrics and /health under load",
    "## One budget eviction as the radix tree grows": "Eviction and budgets",
    "## Hostile requests while another request decodes": "Hostile requests",
    PAGED_LOGITS_HEADING: "Idle cells and paged attention",
    kv_types.HEADING: "KV cache types",
    api_parity.HEADING: "One workload through three APIs",
    "## Workloads on a sliding-window model": "Sliding-window and hybrid models",
    "## Workloads on a hybrid model": "Sliding-window and hybrid models",
    checkpoint_agreement.HEADING: "Sliding-window and hybrid models",
    swa_memory.HEADING: "Sliding-window KV memory",
    paged_kernel_check.HEADING: "Idle cells and paged attention",
    DEVICE_HEADING: "Paged attention on a GPU",
    speculative.HEADING: "Speculative decoding",
    story_run.HEADING: "The story writer's 20-prompt run",
    report_cache.HEADING: report_cache.READING_TOPIC,
}


def anchor(heading: str) -> str:
    """GitHub's anchor for a heading: lower case, punctuation dropped, spaces to hyphens."""
    return re.sub(r"[^a-z0-9 _-]", "", heading.strip().lower()).replace(" ", "-")


def reading_pointer(section: list[str]) -> list[str]:
    """The section followed by one line that says where its figures are read."""
    topic = next((t for h, t in READING_TOPICS.items() if section[0].startswith(h)), None)
    if topic is None:
        return section
    body = [line for line in section if not line.startswith(READING_PREFIX)]
    while body and not body[-1].strip():
        body.pop()
    return body + ["", f"{READING_PREFIX}[{READING.as_posix()}, “{topic}”]({READING.name}#{anchor(topic)}).", ""]


CARRIED = "_Carried over from an earlier generation of this file: not re-measured in this revision"


def _old_sections(path: Path) -> dict[str, list[str]]:
    """The sections ('## ' headings) of the previous docs/benchmarks.md, by heading; its machine line
    under the key 'Machine:'."""
    if not path.exists():
        return {}
    out: dict[str, list[str]] = {}
    current = None
    for line in path.read_text().splitlines():
        if line.startswith("## "):
            current = line
            out[current] = []
        elif current is not None:
            out[current].append(line)
        elif line.startswith("Machine: "):
            out["Machine:"] = [line.removeprefix("Machine: ").split(". Model:")[0].rstrip(".")]
    return out


def _or_carried(section: list[str], old: dict[str, list[str]]) -> list[str]:
    """A section with no results this time keeps its earlier figures, marked as such with the machine they
    were measured on (the mark of an earlier carry is kept as it was)."""
    if not any(line.startswith("Not measured in this revision") for line in section):
        return section
    body = old.get(section[0])
    if not body or any(line.startswith("Not measured in this revision") for line in body):
        return section
    marks = [line for line in body if line.startswith(CARRIED)]
    body = [line for line in body if not line.startswith(CARRIED) and not line.startswith(READING_PREFIX)]
    while body and not body[0].strip():  # keep the blank lines from piling up generation after generation
        body = body[1:]
    machine_was = old.get("Machine:", [""])[0]
    mark = marks[0] if marks else CARRIED + (f" (measured on {machine_was})._" if machine_was else "._")
    return [section[0], "", mark, ""] + body


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--results", type=Path, default=Path("bench/results"))
    p.add_argument("--out", type=Path, default=Path("docs/benchmarks.md"))
    p.add_argument("--device-results", type=Path, help="a GPU host's results.tgz (bench/device_suite.sh), unpacked "
                   "into RESULTS/device/ (replacing what was there) first: one command from a device run to the docs")
    a = p.parse_args(argv)
    if a.device_results is not None:
        unpack_device_results(a.device_results, a.results / DEVICE_DIR)
    lines = ["# Benchmarks", "", "Generated by `python -m bench.report` from `bench/results/` (raw JSON, not "
             "committed): the tables only. What they show, what is not done yet, and the figures measured by "
             f"hand are in [{READING.as_posix()}]({READING.name}) (links relative to docs/); each section "
             "points to its part. The figures of a table come from one machine, measured side by side (a section "
             "carried over from an earlier generation names its machine); machines are shared and noisy, so "
             "compare ratios within a table, not absolute numbers across tables.", "",
             f"Machine: {machine()}. Model: the embedded SmolLM2-135M-Instruct Q4_1 unless a section names "
             "another.", ""]
    old = _old_sections(a.out)
    sections = [section(a.results) for section in (engine_section, unified_section, idle_cells_section,
                                                    paged_section, paged_logits_section, cache_micro_section,
                                                    kv_layouts.report_section)]
    sections += [run_all_section(a.results, dirname) for dirname in RUN_ALL_DIRS]
    sections += [section(a.results) for section in (n_choices_section, soak_section, loop_latency_section,
                                                    tree_evict_section, hostile_section,
                                                    kv_types.report_section, api_parity.report_section,
                                                    checkpoint_agreement.report_section, swa_memory.report_section,
                                                    paged_kernel_check.report_section, speculative.report_section,
                                                    story_run.report_section, report_cache.report_section,
                                                    device_section)]
    for section in sections:
        lines += reading_pointer(_or_carried(section, old))
    a.out.parent.mkdir(parents=True, exist_ok=True)
    a.out.write_text("\n".join(lines))
    print("wrote", a.out)


if __name__ == "__main__":
    main()
