"""Decode throughput of the engine alone (no HTTP), to separate the engine's cost from the HTTP
layer's in bench.engine_throughput (run it with the same --model, --threads and stream counts).

    python -m bench.engine_inprocess [--model M.gguf] [--threads 2] [--parallel 4] \\
        [--levels 1,2,4] [--max-tokens 64] [--repeat 1]

Each level also splits the engine thread's time per step: `forward_us_per_step` (llama_decode and
sampling: EngineStats.busy_seconds) against `rest_us_per_step` (the step's Python around it:
planning, delivery, the sequences' bookkeeping), from the first token of any request to the end of
the last. With --repeat N each level runs N times in turns and keeps the median by tok/s.
"""

from __future__ import annotations

import argparse
import json
import threading
import time
from pathlib import Path

from server import bootstrap
from server.engine.sampling_params import SamplingParams
from server.engine.sequence import Finished, GenerationRequest
from server.settings import ServerSettings


def decode_level(model, n: int, max_tokens: int) -> dict:
    """`n` concurrent greedy requests of `max_tokens` tokens (ignore_eos): their aggregate decode
    tokens/s and the engine thread's time per step, split as the module docstring says."""
    done = [threading.Event() for _ in range(n)]
    first: list[float | None] = [None] * n
    end: list[float] = [0.0] * n
    count = [0] * n
    at_first: list = []  # the engine's stats when the first token of any request arrived

    for i in range(n):
        tokens = model.runtime.tokenize(f"Request {i}: write about pumps and rivers.", add_special=False,
                                        parse_special=False)

        def sink(ev, i=i):
            if isinstance(ev, Finished):
                end[i], count[i] = time.perf_counter(), ev.completion_tokens
                done[i].set()
            elif first[i] is None:
                first[i] = time.perf_counter()
                if not at_first:  # the sink runs on the engine thread, between steps
                    at_first.append(model.engine.stats())

        model.engine.submit(GenerationRequest(tokens, SamplingParams(temperature=0), max_tokens, ignore_eos=True), sink)
    for d in done:
        d.wait(600)
    after = model.engine.stats()
    span = max(end) - min(t for t in first if t is not None)
    steps = after.n_decode_calls - at_first[0].n_decode_calls
    busy = after.busy_seconds - at_first[0].busy_seconds
    return {"concurrency": n, "decode_tok_s": sum(c - 1 for c in count) / span,
            "forward_us_per_step": busy / steps * 1e6 if steps else None,
            "rest_us_per_step": (span - busy) / steps * 1e6 if steps else None}


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model", type=Path, default=None, help="GGUF file (default: the embedded model)")
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--parallel", type=int, default=4, help="slots (more requests than slots queue)")
    p.add_argument("--levels", default="1,2,4", help="concurrent requests, comma-separated")
    p.add_argument("--max-tokens", type=int, default=64)
    p.add_argument("--repeat", type=int, default=1)
    p.add_argument("--out", type=Path, default=Path("bench/results/engine_inprocess.json"))
    a = p.parse_args(argv)
    levels = [int(x) for x in a.levels.split(",")]
    model = bootstrap.load(ServerSettings(model=a.model, parallel=a.parallel, ctx_size=8192,
                                          threads=a.threads, no_cache=True))
    try:
        decode_level(model, 1, 8)  # warm-up
        samples: dict[int, list[dict]] = {n: [] for n in levels}
        for _ in range(a.repeat):
            for n in levels:
                samples[n].append(decode_level(model, n, a.max_tokens))
    finally:
        model.close()
    rows = []
    for n in levels:
        ordered = sorted(samples[n], key=lambda r: r["decode_tok_s"])
        rows.append({**ordered[len(ordered) // 2],
                     "decode_tok_s_samples": [round(r["decode_tok_s"], 1) for r in samples[n]]})
    a.out.parent.mkdir(parents=True, exist_ok=True)
    meta = {"model": str(a.model or "embedded"), "threads": a.threads, "parallel": a.parallel,
            "max_tokens": a.max_tokens, "repeat": a.repeat}
    a.out.write_text(json.dumps({**meta, "levels": rows}, indent=2))
    print(json.dumps(rows))


if __name__ == "__main__":
    main()
