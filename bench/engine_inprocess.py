"""Decode throughput of the engine alone (no HTTP), at 1, 2 and 4 concurrent requests, to
separate the engine's cost from the HTTP layer's in bench.engine_throughput.

    python -m bench.engine_inprocess [--max-tokens 64]
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


def decode_rate(model, n: int, max_tokens: int) -> float:
    """Aggregate decode tokens/s from the first token of any request to the end of the last."""
    done = [threading.Event() for _ in range(n)]
    first: list[float | None] = [None] * n
    end: list[float] = [0.0] * n
    count = [0] * n
    for i in range(n):
        tokens = model.runtime.tokenize(f"Request {i}: write about pumps and rivers.", add_special=False,
                                        parse_special=False)

        def sink(ev, i=i):
            if isinstance(ev, Finished):
                end[i], count[i] = time.perf_counter(), ev.completion_tokens
                done[i].set()
            elif first[i] is None:
                first[i] = time.perf_counter()

        model.engine.submit(GenerationRequest(tokens, SamplingParams(temperature=0), max_tokens, ignore_eos=True), sink)
    for d in done:
        d.wait(600)
    return sum(c - 1 for c in count) / (max(end) - min(t for t in first if t is not None))


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--max-tokens", type=int, default=64)
    p.add_argument("--out", type=Path, default=Path("bench/results/engine_inprocess.json"))
    a = p.parse_args(argv)
    model = bootstrap.load(ServerSettings(parallel=4, ctx_size=8192, threads=2, no_cache=True))
    try:
        decode_rate(model, 1, 8)  # warm-up
        rows = [{"concurrency": n, "decode_tok_s": decode_rate(model, n, a.max_tokens)} for n in (1, 2, 4)]
    finally:
        model.close()
    a.out.parent.mkdir(parents=True, exist_ok=True)
    a.out.write_text(json.dumps({"max_tokens": a.max_tokens, "levels": rows}, indent=2))
    print(json.dumps(rows))


if __name__ == "__main__":
    main()
