"""What one mixed ubatch costs: the decode tokens of N long sequences beside a prompt chunk of another,
the ubatch the scheduler builds while a request prefills and others decode.

    python -m bench.mixed_ubatch [--model M.gguf] [--seqs 8] [--context 2900] [--chunk 64]

N sequences first get a prompt of --context tokens. Then the same ubatch runs --steps times (one
decode token per sequence at its next position, then --chunk prompt tokens of one more sequence),
its tokens removed after each run, so every run sees the same KV. Unified KV, paged and unpaged,
in turns; the median milliseconds of a ubatch. Run it once with LLAMA_CPP_LIB_PATH pointing at
another build of the patched library to compare two kernels side by side.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from pathlib import Path

from bench.unified_vs_split import prefill_prompts
from server.engine.llama_runtime import BatchEntry, LlamaRuntime, RuntimeConfig
from server.model_file import embedded_model_path

WARMUP = 5  # runs left out of the median (first touches of the buffers)


def ubatch_ms(model: Path, paged: bool, n_seqs: int, context: int, chunk: int, steps: int, threads: int,
              page_size: int) -> float:
    rt = LlamaRuntime(RuntimeConfig(model, n_ctx=n_seqs * (context + 64) + chunk + 256, n_batch=512,
                                    n_seq_max=n_seqs + 1, n_threads=threads, n_threads_batch=threads,
                                    kv_unified=True, paged_attn="on" if paged else "off", page_size=page_size,
                                    page_placement="shared"))
    try:
        prompt = prefill_prompts(rt, n_seqs, context)
        times = []
        for step in range(steps + WARMUP):
            batch = ([BatchEntry(100 + step, context, s, True) for s in range(n_seqs)]
                     + [BatchEntry(prompt[i], i, n_seqs, i == chunk - 1) for i in range(chunk)])
            t0 = time.perf_counter()
            rt.decode(batch)
            times.append(time.perf_counter() - t0)
            for s in range(n_seqs):
                rt.seq_rm(s, context, -1)
            rt.seq_rm(n_seqs, -1, -1)
        return statistics.median(times[WARMUP:]) * 1e3
    finally:
        rt.close()


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model", type=Path, default=None)
    p.add_argument("--seqs", type=int, default=8)
    p.add_argument("--context", type=int, default=2900)
    p.add_argument("--chunk", type=int, default=64)
    p.add_argument("--steps", type=int, default=25)
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--page-size", type=int, default=16)
    p.add_argument("--out", type=Path, default=Path("bench/results/mixed_ubatch.json"))
    a = p.parse_args(argv)
    model = a.model or embedded_model_path()
    rows: dict[str, list[float]] = {"unpaged": [], "paged": []}
    for _ in range(a.repeats):  # interleaved, so drift on a shared machine hits both alike
        for name in rows:
            rows[name].append(round(ubatch_ms(model, name == "paged", a.seqs, a.context, a.chunk, a.steps,
                                              a.threads, a.page_size), 2))
    medians = {k: statistics.median(v) for k, v in rows.items()}
    out = {"model": str(model), "seqs": a.seqs, "context": a.context, "chunk": a.chunk, "page_size": a.page_size,
           "ubatch_ms": rows, "median_ms": medians, "paged_over_unpaged": medians["paged"] / medians["unpaged"]}
    a.out.parent.mkdir(parents=True, exist_ok=True)
    a.out.write_text(json.dumps(out, indent=2))
    print(json.dumps(out, indent=2))


if __name__ == "__main__":
    main()
