"""bench.report renders what a result file holds, and says so when one is missing."""

from __future__ import annotations

import json

from bench.report import idle_cells_section, run_all_section


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
            for ps, held in ((0, {k: v * 1.5 for k, v in empty.items()}), (16, {k: v * 1.01 for k, v in empty.items()}))]
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
        "unified_paged_over_split": 1.02, "best_tok_s": {"split": 2000.0, "unified": 1800.0, "unified_paged": 2040.0}}))
    text = "\n".join(paged_section(tmp_path))
    assert "| arbor-server | 8 | 3050 | 1.50 | 250.0 |" in text
    assert "| llama-server (split KV) | 8 | 3050 | 1.50 | 240.0 |" in text
    assert "unified + paged 2040 (**1.02x**)" in text
