"""bench.report renders what a result file holds, and says so when one is missing."""

from __future__ import annotations

import json

from bench.report import idle_cells_section
from bench.report_run_all import run_all_section


def test_idle_cells_section_renders_the_measured_slowdown(tmp_path):
    assert "Not measured in this revision." in idle_cells_section(tmp_path)
    empty = {"prefill_0_512_ms": 35.0, "prefill_512_1024_ms": 50.0, "decode_step_ms": 1.25}
    held = {"prefill_0_512_ms": 87.5, "prefill_512_1024_ms": 100.0, "decode_step_ms": 2.5}
    (tmp_path / "idle_cells.json").write_text(json.dumps({
        "model": "/m/synth.gguf", "n_gpu_layers": 999, "threads": 8, "idle_cells": 12000, "empty": empty,
        "with_idle_cells": held, "slowdown": {k: held[k] / empty[k] for k in empty}}))
    text = "\n".join(idle_cells_section(tmp_path))
    assert "`synth.gguf`, --n-gpu-layers 999, 12000 idle cells" in text
    assert "| every cell (unpaged) | one decode step (ms) | 1.2 | 2.5 | 2.00x |" in text
    assert "| every cell (unpaged) | prefill, tokens 0-512 (ms) | 35.0 | 87.5 | 2.50x |" in text


def test_idle_cells_section_shows_paged_and_unpaged_runs(tmp_path):
    empty = {"prefill_0_512_ms": 40.0, "prefill_512_1024_ms": 50.0, "decode_step_ms": 2.0}
    runs = [{"page_size": ps, "idle_cells": 12000, "empty": empty, "with_idle_cells": held,
             "slowdown": {k: held[k] / empty[k] for k in empty}}
            for ps, held in ((0, {k: v * 1.5 for k, v in empty.items()}),
                             (16, {k: v * 1.01 for k, v in empty.items()}))]
    (tmp_path / "idle_cells.json").write_text(json.dumps({"model": "/m/e.gguf", "n_gpu_layers": 0, "runs": runs}))
    text = "\n".join(idle_cells_section(tmp_path))
    assert "| every cell (unpaged) | one decode step (ms) | 2.0 | 3.0 | 1.50x |" in text
    assert "| paged, 16-cell pages | one decode step (ms) | 2.0 | 2.0 | 1.01x |" in text


def test_run_all_section_shows_the_command_that_produced_it(tmp_path):
    (tmp_path / "run_all").mkdir()
    (tmp_path / "run_all" / "index.json").write_text(json.dumps({
        "started": "2026-12-01 06:00:00", "concurrency": 4, "model": "/m/synth.gguf",
        "command": "python -m bench.run_all --large --same-prompts", "runs": []}))
    text = "\n".join(run_all_section(tmp_path, "run_all"))
    assert "Command: `python -m bench.run_all --large --same-prompts`" in text
    assert "model `synth.gguf`" in text


def test_paged_section_renders_the_seed_shape_and_the_synthetic_figures(tmp_path):
    from bench.report import paged_section

    assert "Not measured in this revision." in paged_section(tmp_path)
    level = {"concurrency": 8, "prompt_tokens_mean": 3050.0, "ttft_mean_s": 1.5, "decode_tok_s": 250.0}
    (tmp_path / "seed_shape_synth.json").write_text(json.dumps({
        "model": "/m/synth.gguf", "settings": {"parallel": 8, "ctx_size": 32768, "streams": "8", "prompt_tokens": 3000,
                                               "max_tokens": 128, "repeat": 2},
        "runs": [{"name": "arbor-server", "levels": [level]},
                 {"name": "llama-server (split KV)", "levels": [dict(level, decode_tok_s=240.0)]}]}))
    (tmp_path / "unified_vs_split_synth.json").write_text(json.dumps({
        "model": "/m/synth.gguf", "tokens": 128, "prompt": 32, "seqs": 4, "unified_over_split": 0.9,
        "unified_paged_over_split": 1.02, "unified_paged_shared_pages_over_split": 0.95,
        "tok_s": {"split": [1990.0, 2000.0]},
        "best_tok_s": {"split": 2000.0, "unified": 1800.0, "unified_paged": 2040.0,
                       "unified_paged_shared_pages": 1900.0}}))
    text = "\n".join(paged_section(tmp_path))
    assert "| arbor-server | 8 | 3050 | 1.50 | 250.0 |" in text
    assert "| llama-server (split KV) | 8 | 3050 | 1.50 | 240.0 |" in text
    assert "--seqs 4 --tokens 128 --prompt 32`, best of 2 interleaved repeats" in text
    assert "unified + paged with owned pages 2040 (**1.02x**)" in text
    assert "llama.cpp's placement (decode tokens of all sequences sharing pages) 1900 (0.95x)" in text
    assert "--max-tokens 128 --repeat 2`, model" in text  # a run without variants names none


def test_the_seed_shape_command_names_the_variants_the_run_added(tmp_path):
    from bench.report import paged_section

    level = {"concurrency": 8, "prompt_tokens_mean": 16010.0, "ttft_mean_s": 0.5, "decode_tok_s": 900.0}
    (tmp_path / "seed_shape_gpu.json").write_text(json.dumps({
        "model": "/tmp/w/model.gguf", "settings": {"parallel": 8, "ctx_size": 131072, "streams": "8",
                                                   "prompt_tokens": 16000, "max_tokens": 128, "repeat": 1,
                                                   "arbor_paged": True, "arbor_unpaged": False},
        "runs": [{"name": "arbor-server --paged-attn on", "levels": [level]}]}))
    text = "\n".join(paged_section(tmp_path))
    assert "**Seed 002's shape, GPU host (bench/device_suite.sh)**" in text
    assert "--max-tokens 128 --repeat 1 --arbor-paged`, model `model.gguf`" in text
    assert "| arbor-server --paged-attn on | 8 | 16010 | 0.50 | 900.0 |" in text


def _hostile(only="", server_args="", cases=None, stalls=None, baseline=0.5, longest=3.0):
    cases = cases or [
        {"name": "a 10 MB body", "status": 413, "kind": "clear error", "latency_s": 0.01},
        {"name": "no API key", "status": 401, "kind": "clear error", "latency_s": 0.002},
        {"name": "120 tools within the limits", "status": 200, "kind": "served sanely", "latency_s": 60.94}]
    return {"command": "/v/bin/python -m server --port 4811 --parallel 4 --api-key k", "n_cases": len(cases),
            "settings": {"stall_s": 0.5, "only": only, "server_args": server_args},
            "n_clear_errors": sum(c["kind"] == "clear error" for c in cases),
            "n_served_sanely": sum(c["kind"] == "served sanely" for c in cases), "cases": cases,
            "five_xx": [], "neither_clear_nor_sane": [], "unexpected_outcome": [], "health_after": 200,
            "slots_after_idle": True,
            "watcher": {"streams": 3, "tokens_per_stream": 200, "baseline_max_gap_s": baseline, "max_gap_s": longest},
            "stalls_over_threshold": stalls if stalls is not None else [
                {"stream": 1, "gap_s": longest, "cases_in_flight": ["120 tools within the limits"]},
                {"stream": 1, "gap_s": 1.2, "cases_in_flight": []}]}


def test_hostile_section_counts_outcomes_and_names_the_cases_behind_the_longest_gaps(tmp_path):
    from bench.report import hostile_section

    assert "Not measured in this revision." in hostile_section(tmp_path)
    (tmp_path / "hostile_requests.json").write_text(json.dumps(_hostile(longest=11.979)))
    one = [{"name": "120 tools within the limits", "status": 200, "kind": "served sanely", "latency_s": 58.18}]
    (tmp_path / "hostile_prefill_pwd128.json").write_text(json.dumps(_hostile(
        only="120 tools", server_args="--prefill-while-decoding 128", cases=one, baseline=0.577, longest=3.383)))
    text = "\n".join(hostile_section(tmp_path))
    assert "Server: `arbor-server --parallel 4 --api-key k`." in text  # no interpreter, no port
    assert "| clear errors | 2 (401: 1, 413: 1) |" in text
    assert "| 5xx | 0 |" in text and "| /health after | 200 |" in text
    assert "| longest gap while the cases ran | 11.98 s |" in text
    assert "| 120 tools within the limits | 11.98 |" in text and "| no case in flight | 1.20 |" in text
    assert ("| --prefill-while-decoding 128 | 120 tools within the limits (58.2 s) | 0.58 | 3.38 | "
            "3.38 s (120 tools within the limits) |") in text


def test_every_section_points_to_a_heading_of_the_reading():
    from pathlib import Path

    from bench.report import READING, READING_TOPICS, anchor

    headings = {anchor(line.lstrip("#")) for line in Path(READING).read_text().splitlines() if line.startswith("#")}
    assert {anchor(topic) for topic in READING_TOPICS.values()} <= headings


def test_regenerating_without_results_keeps_the_tables_and_one_pointer_each(tmp_path):
    from bench.report import main

    results, out = tmp_path / "results", tmp_path / "docs" / "benchmarks.md"
    results.mkdir()
    (results / "hostile_requests.json").write_text(json.dumps(_hostile()))
    main(["--results", str(results), "--out", str(out)])
    first = out.read_text()
    assert "| served sanely | 1 |" in first
    assert first.count("Reading these figures: ") == first.count("\n## ")
    assert "[docs/benchmark-notes.md, “Hostile requests”](benchmark-notes.md#hostile-requests)" in first

    (results / "hostile_requests.json").unlink()  # raw results are not committed
    main(["--results", str(results), "--out", str(out)])
    second = out.read_text()
    hostile = second[second.index("## Hostile requests"):].split("\n## ")[0]  # up to the next section
    assert "| served sanely | 1 |" in hostile
    assert "_Carried over from an earlier generation of this file: not re-measured in this revision (measured on " \
        in hostile
    assert hostile.count("Reading these figures: ") == 1
    main(["--results", str(results), "--out", str(out)])
    assert out.read_text() == second  # a carried section stays as it was


def test_the_device_section_renders_a_gpu_run_and_says_when_there_is_none(tmp_path):
    from bench.report import DEVICE_HEADING, device_section

    assert device_section(tmp_path) == [DEVICE_HEADING, "", "Not measured in this revision.", ""]
    d = tmp_path / "device"
    d.mkdir()
    (d / "README.md").write_text("An H200, patches 0001-0024.\n")
    case = {"head_size": 64, "page_size": 7, "rows": 124, "gqa": 4, "paged_err": 0.0011, "dense_err": 0.001}
    (d / "paged_kernel_sanitizer.json").write_text(json.dumps({"cases": [case] * 32, "failed": 0}))
    (d / "paged_kernel_check.json").write_text(json.dumps({
        "backend": {"name": "CUDA0", "description": "NVIDIA H200"}, "args": ["--backend", "gpu", "--out", "x.json"],
        "cases": [case] * 144, "failed": 0,
        "timings": [{"cells": 131072, "page_size": 16, "seqs": 8, "rows": 512, "paged_ms": 0.887, "dense_ms": 4.014,
                     "paged_over_dense": 0.221}]}))
    (d / "paged_agreement.json").write_text(json.dumps({"n_gpu_layers": 999, "predictions": 802, "agreement": 0.9327}))
    text = "\n".join(device_section(tmp_path))
    assert "An H200, patches 0001-0024." in text
    assert "### The paged kernel against the dense one on random data (issue 33)" in text
    assert "`python -m bench.paged_kernel_check --backend gpu` on CUDA0 (NVIDIA H200)" in text
    assert "**144 of 144 cases passed**" in text and "| 131,072 | 16 | 8 | 512 | 0.887 | 4.014 | 0.22x |" in text
    assert "`compute-sanitizer --tool memcheck` (`--quick`): 32 of 32 cases passed" in text
    assert "### Paged attention against unpaged and stock llama-server" in text
    assert "paged = unpaged for **93.27%**" in text
    assert "two sections above" not in text  # the CPU sections' pointers stay out of the GPU's part
    assert "### Engine" not in text  # no file, no part
