"""What idle KV cells cost the requests that run: a bare llama_decode loop, in one process.

    python -m bench.idle_cells [--model M.gguf] [--n-gpu-layers 999] [--idle 12000] [--page-size 0,16]

With unified KV every sequence's attention spans all cells up to the highest one in use, so
cells that other sequences hold (an idle slot's kept prefix, a resident shared prefix, a
parked copy waiting for write-back) are read, and masked out, at every step of every request.
This measures one sequence's prefill (two 512-token batches) and single-token decode with
the KV otherwise empty, then with `--idle` cells held by 12 other sequences; best of
`--repeats` each. The cache keeps such cells on the device to save recomputation; this is
the price per step that keeping them costs everyone else.

`--page-size` lists the configurations, measured one after the other in one run: 0 is
llama.cpp's attention over every cell, N > 0 paged attention with N-cell pages (our llama.cpp
patch: each sequence reads only the pages it owns cells in).
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

from server.engine.llama_runtime import BatchEntry, LlamaRuntime, RuntimeConfig
from server.model_file import embedded_model_path

OTHERS = 12  # sequences holding the idle cells


def _timed_ms(rt: LlamaRuntime, entries: list[BatchEntry]) -> float:
    t0 = time.perf_counter()
    rt.decode(entries)
    return (time.perf_counter() - t0) * 1000.0


def _one_request(rt: LlamaRuntime, toks: list[int], decode_steps: int) -> dict:
    """Prefill 1,024 tokens in two batches and decode `decode_steps` tokens on sequence 0,
    then free it; ms per batch and mean ms per decode step."""
    first = _timed_ms(rt, [BatchEntry(toks[j], j, 0, j == 511) for j in range(512)])
    second = _timed_ms(rt, [BatchEntry(toks[j], j, 0, j == 1023) for j in range(512, 1024)])
    steps = [_timed_ms(rt, [BatchEntry(toks[1024 + k], 1024 + k, 0, True)]) for k in range(decode_steps)]
    rt.seq_rm(0, -1, -1)
    return {"prefill_0_512_ms": first, "prefill_512_1024_ms": second, "decode_step_ms": sum(steps) / len(steps)}


def _best(runs: list[dict]) -> dict:
    return {k: min(r[k] for r in runs) for k in runs[0]}


def _measure(model: Path, a, page_size: int) -> dict:
    per_seq = a.idle // OTHERS
    rt = LlamaRuntime(RuntimeConfig(model, n_ctx=a.idle + 2048, n_batch=512, n_seq_max=OTHERS + 1,
                                    n_threads=a.threads, n_threads_batch=a.threads, kv_unified=True,
                                    n_gpu_layers=a.n_gpu_layers,
                                    paged_attn="on" if page_size else "off", page_size=page_size or 16))
    try:
        text = "pump valve sensor drift alarm reading report shift " * (max(per_seq, 1100) // 4)
        toks = rt.tokenize(text, add_special=False, parse_special=False)
        empty = _best([_one_request(rt, toks, a.decode_steps) for _ in range(a.repeats)])
        for s in range(1, OTHERS + 1):
            for i in range(0, per_seq, 512):
                n = min(512, per_seq - i)
                rt.decode([BatchEntry(toks[j], j, s, False) for j in range(i, i + n)])
        held = _best([_one_request(rt, toks, a.decode_steps) for _ in range(a.repeats)])
    finally:
        rt.close()
    return {"page_size": page_size, "idle_cells": per_seq * OTHERS, "empty": empty, "with_idle_cells": held,
            "slowdown": {k: held[k] / empty[k] for k in empty}}


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model", type=Path, default=None)
    p.add_argument("--n-gpu-layers", type=int, default=0)
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--idle", type=int, default=12000, help="cells held by other sequences")
    p.add_argument("--decode-steps", type=int, default=20)
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--page-size", default="0", help="comma separated: 0 = unpaged, N = paged attention with "
                   "N-cell pages (default 0)")
    p.add_argument("--out", type=Path, default=Path("bench/results/idle_cells.json"))
    a = p.parse_args(argv)
    model = a.model or embedded_model_path()
    runs = [_measure(model, a, int(ps)) for ps in a.page_size.split(",")]
    out = {"model": str(model), "n_gpu_layers": a.n_gpu_layers, "threads": a.threads, "runs": runs}
    if len(runs) > 1 and runs[0]["page_size"] == 0:
        base = runs[0]["with_idle_cells"]
        out["with_idle_cells_vs_unpaged"] = {r["page_size"]: {k: r["with_idle_cells"][k] / base[k] for k in base}
                                             for r in runs[1:]}
    a.out.parent.mkdir(parents=True, exist_ok=True)
    a.out.write_text(json.dumps(out, indent=2))
    print(json.dumps(out, indent=2))


if __name__ == "__main__":
    main()
