"""Paged attention against llama.cpp's attention over every cell, on one model: the same scripted KV
operations on two contexts, every top-1 prediction compared (teacher-forced agreement).

    python -m bench.paged_agreement [--model M.gguf] [--n-gpu-layers 999] [--page-size 16] [--cache-type q8_0]

The script mixes what the cache does to the unified KV: an idle sequence's kept cells, a prefix
shared by seq_cp and continued by both sharers in one batch, cells freed in the middle of the
pool and reused, a sequence saved and restored under another id, then decode steps of three
sequences at once. On a GPU host (`--n-gpu-layers`), decode steps run CUDA's paged kernel, so
this is its correctness check (tests/server/engine/test_paged_attention_real.py runs it on the CPU).
`--cache-type` sets both KV types (`--cache-type-k/-v`) of both contexts: the CPU kernel's paged
path over quantized K and V against llama.cpp's attention over the same types.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import numpy as np

from server.engine.llama_runtime import BatchEntry, LlamaRuntime, RuntimeConfig
from server.model_file import embedded_model_path

TEXT = ("The pump on line 3 reported a pressure drop at 04:10; the valve sensor drifted by two percent "
        "and the operator logged an alarm. Maintenance replaced the seal and the reading recovered. ")


def _top1(rt: LlamaRuntime, entries: list[BatchEntry]) -> list[int]:
    return [int(np.argmax(np.ctypeslib.as_array(rt.logits_row(i)))) for i in rt.decode(entries)]


def workload(rt: LlamaRuntime) -> list[int]:
    """Every prediction of a scripted mix of prefill and decode over a busy unified KV."""
    toks = rt.tokenize(TEXT * 12, add_special=False, parse_special=False)
    preds: list[int] = []

    def fill(seq: int, start: int, n: int, logits: bool) -> None:
        for i in range(start, start + n, 128):
            chunk = range(i, min(i + 128, start + n))
            preds.extend(_top1(rt, [BatchEntry(toks[j % len(toks)], j, seq, logits) for j in chunk]))

    fill(3, 0, 400, False)          # an idle slot's kept prefix
    fill(0, 0, 300, True)           # a shared system prompt ...
    rt.seq_cp(0, 1)                 # ... attached by seq 1 (no copy)
    fill(4, 0, 300, False)          # another idle sequence above it
    # both sharers continue in one batch with different suffixes
    entries = [BatchEntry(toks[(300 + k) % len(toks)], 300 + k, 0, True) for k in range(40)]
    entries += [BatchEntry(toks[(500 + k) % len(toks)], 300 + k, 1, True) for k in range(40)]
    preds.extend(_top1(rt, entries))
    rt.seq_rm(3, -1, -1)            # cells freed in the middle of the pool ...
    fill(2, 0, 350, True)           # ... and reused by a new sequence
    state = bytes(rt.state_seq_get(0))
    rt.seq_rm(0, -1, -1)
    if not rt.state_seq_set(state, 5):  # seq 0 restored as seq 5 (a host-tier restore)
        raise RuntimeError("restoring the saved sequence failed")
    for step in range(24):          # decode steps: three sequences, one token each
        preds.extend(_top1(rt, [BatchEntry(toks[(340 + step) % len(toks)], 340 + step, 5, True),
                                BatchEntry(toks[(540 + step) % len(toks)], 340 + step, 1, True),
                                BatchEntry(toks[(350 + step) % len(toks)], 350 + step, 2, True)]))
    return preds


def agreement(model: Path, *, n_gpu_layers: int = 0, page_size: int = 16, threads: int = 2,
              cache_type: str = "f16") -> dict:
    preds = {}
    for mode in ("off", "on"):
        rt = LlamaRuntime(RuntimeConfig(model, n_ctx=4096, n_batch=256, n_seq_max=6, n_threads=threads,
                                        n_threads_batch=threads, n_gpu_layers=n_gpu_layers, paged_attn=mode,
                                        page_size=page_size, cache_type_k=cache_type, cache_type_v=cache_type,
                                        flash_attn=True if cache_type != "f16" else None))
        try:
            if rt.paged_attn.enabled != (mode == "on"):
                raise RuntimeError(f"paged attention {mode} was asked for, {rt.paged_attn} is in force")
            preds[mode] = workload(rt)
        finally:
            rt.close()
    a, b = np.array(preds["off"]), np.array(preds["on"])
    return {"model": str(model), "n_gpu_layers": n_gpu_layers, "page_size": page_size, "cache_type": cache_type,
            "predictions": len(a),
            "agreement": float((a == b).mean())}


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model", type=Path, default=None)
    p.add_argument("--n-gpu-layers", type=int, default=0)
    p.add_argument("--page-size", type=int, default=16)
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--cache-type", default="f16", help="K and V type of the KV cache (f16, q8_0, q4_0, ...)")
    p.add_argument("--out", type=Path, default=Path("bench/results/paged_agreement.json"))
    a = p.parse_args(argv)
    out = agreement(a.model or embedded_model_path(), n_gpu_layers=a.n_gpu_layers, page_size=a.page_size,
                    threads=a.threads, cache_type=a.cache_type)
    a.out.parent.mkdir(parents=True, exist_ok=True)
    a.out.write_text(json.dumps(out, indent=2))
    print(json.dumps(out, indent=2))


if __name__ == "__main__":
    main()
