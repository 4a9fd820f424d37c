"""bench/swa_memory.py: the full-attention twin it derives from a sliding-window model is one to
llama.cpp (every layer global, one KV cache), and it reads the KV caches from llama.cpp's own log."""

from __future__ import annotations

import importlib.util

import pytest

from bench.swa_memory import derive_full_attention, kv_report

needs_llama_cpp = pytest.mark.skipif(importlib.util.find_spec("llama_cpp") is None,
                                     reason="llama-cpp-python is not installed (scripts/setup.sh)")

# as the pinned llama.cpp logs them (a --log-level debug server on gemma3-swa-bench6.gguf)
LOG = """\
llama_kv_cache_iswa: creating non-SWA KV cache, size = 10240 cells
llama_kv_cache:        CPU KV buffer size =    10.00 MiB
llama_kv_cache: size =   10.00 MiB ( 10240 cells,   1 layers, 14/1 seqs), K (f16):    5.00 MiB, V (f16):    5.00 MiB
llama_kv_cache_iswa: creating     SWA KV cache, size = 7680 cells
llama_kv_cache: size =   37.50 MiB (  7680 cells,   5 layers, 14/1 seqs), K (f16):   18.75 MiB, V (f16):   18.75 MiB
sched_reserve:        CPU compute buffer size =    90.00 MiB
sched_reserve:        CPU compute buffer size =   102.03 MiB
~llama_context:        CPU compute buffer size is 102.0254 MiB, matches expectation of 102.0254 MiB
"""


def test_the_kv_caches_and_compute_buffers_are_read_from_llama_cpps_log():
    got = kv_report(LOG)
    assert [(c["cells"], c["layers"], c["seqs"], c["mib"]) for c in got["caches"]] == [(10240, 1, 14, 10.0),
                                                                                       (7680, 5, 14, 37.5)]
    assert got["kv_mib"] == 47.5 and got["compute"] == {"CPU": 102.03}  # the last reservation counts


@needs_llama_cpp
def test_the_derived_model_has_no_sliding_window_and_the_same_shape(tmp_path):
    from harness.models.synth_swa_hybrid import write_swa_model
    from server.engine.llama_runtime import LlamaRuntime, RuntimeConfig

    swa = write_swa_model(tmp_path / "gemma3-tiny.gguf", seed=3)
    full = derive_full_attention(swa, tmp_path / "gemma3-tiny-full-attention.gguf")
    seen = []
    for path in (swa, full):
        rt = LlamaRuntime(RuntimeConfig(path, n_ctx=256, n_batch=64, n_seq_max=1, n_threads=1, n_threads_batch=1,
                                        paged_attn="off"))
        try:
            i = rt.info
            seen.append((i.architecture, i.n_swa, i.n_layer, i.n_embd, i.n_params, i.n_vocab))
        finally:
            rt.close()
    assert seen[0][1] == 32 and seen[1][1] == 0  # every layer global
    assert seen[0][:1] + seen[0][2:] == seen[1][:1] + seen[1][2:]
    assert full.stat().st_size < swa.stat().st_size + 4096 and not full.with_suffix(".tmp").exists()
