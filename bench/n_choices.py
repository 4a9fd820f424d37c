"""n choices from one prompt against n separate concurrent requests, on one arbor-server.

    python -m bench.n_choices [--model M.gguf] [--n 4] [--max-tokens 128] [--rounds 3] [--prompt-words 200]

Both modes send the same prompt (a fresh one per round, so only the chat template's opening
is cached beforehand), sampled at temperature 0.8 with `ignore_eos`, so every choice
produces exactly --max-tokens tokens. Reported per mode (median over rounds, the modes
alternating so machine noise hits both alike): decode tok/s (completion tokens after each
choice's first / (last end - first first token)), wall time, and the prompt tokens the
server computed (from cached_tokens). The issue's target: n=4's decode tok/s >= 0.9x that
of four separate requests, with its prompt computed once.

Writes --out (default bench/results/n_choices.json); bench/report.py summarises it.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import time
import uuid
from pathlib import Path

import httpx

from harness.serving import sse
from harness.serving.servers import arbor_command, free_port, running

WORDS = "the pump station logs pressure flow and temperature every minute for the field crew".split()


def prompt(words: int) -> list[dict]:
    text = " ".join(WORDS[i % len(WORDS)] for i in range(words))
    return [{"role": "user", "content": f"[{uuid.uuid4().hex[:8]}] {text}. Summarise."}]


async def stream(client: httpx.AsyncClient, url: str, body: dict) -> dict:
    """One streamed request: per-choice first-token times, its end, usage and arbor figures."""
    t0 = time.perf_counter()
    first: dict[int, float] = {}
    tail: dict = {}
    streamed = {**body, "stream": True, "stream_options": {"include_usage": True}}
    async with client.stream("POST", url, json=streamed) as r:
        r.raise_for_status()
        async for chunk in sse.ajson_chunks(r.aiter_lines()):
            for c in chunk.get("choices", []):
                if c["delta"].get("content") and c["index"] not in first:
                    first[c["index"]] = time.perf_counter()
            if chunk.get("usage"):
                tail = chunk
    end = time.perf_counter()
    return {"t0": t0, "first": min(first.values(), default=end), "end": end, "n_first": len(first),
            "usage": tail.get("usage", {}), "arbor": tail.get("arbor", {})}


def computed_prompt_tokens(result: dict) -> int:
    usage, arbor = result["usage"], result["arbor"]
    if "choices" in arbor:
        return sum(usage["prompt_tokens"] - c["cached_tokens"] for c in arbor["choices"])
    return usage["prompt_tokens"] - usage["prompt_tokens_details"]["cached_tokens"]


async def one_round(url: str, mode: str, n: int, max_tokens: int, words: int) -> dict:
    body = {"messages": prompt(words), "max_tokens": max_tokens, "temperature": 0.8, "seed": 5, "ignore_eos": True}
    async with httpx.AsyncClient(timeout=600) as client:
        if mode == "n":
            results = [await stream(client, url, {**body, "n": n})]
        else:
            results = await asyncio.gather(*(stream(client, url, {**body, "seed": 5 + i}) for i in range(n)))
    tokens = sum(r["usage"]["completion_tokens"] for r in results)
    first, end, t0 = min(r["first"] for r in results), max(r["end"] for r in results), min(r["t0"] for r in results)
    return {"decode_tok_s": (tokens - n) / (end - first) if end > first else 0.0, "wall_s": end - t0,
            "completion_tokens": tokens, "prompt_tokens": results[0]["usage"]["prompt_tokens"],
            "computed_prompt_tokens": sum(computed_prompt_tokens(r) for r in results)}


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model", type=Path, default=None, help="GGUF file (default: the embedded model)")
    p.add_argument("--n", type=int, default=4)
    p.add_argument("--parallel", type=int, default=4)
    p.add_argument("--ctx-size", type=int, default=8192)
    p.add_argument("--max-tokens", type=int, default=128)
    p.add_argument("--prompt-words", type=int, default=200)
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--out", type=Path, default=Path("bench/results/n_choices.json"))
    a = p.parse_args(argv)
    port = free_port()
    cmd = arbor_command(port, a.model, ["--parallel", str(a.parallel), "--ctx-size", str(a.ctx_size),
                                        "--log-level", "warning"])
    rows: dict[str, list[dict]] = {"n": [], "separate": []}
    with running(f"arbor-n-{port}", cmd, port, a.out.parent / "logs") as srv:
        url = srv.v1 + "/chat/completions"
        asyncio.run(one_round(url, "separate", 1, 4, 8))  # warm-up
        for _ in range(a.rounds):
            for mode in ("n", "separate"):
                rows[mode].append(asyncio.run(one_round(url, mode, a.n, a.max_tokens, a.prompt_words)))
                print(mode, json.dumps(rows[mode][-1]), flush=True)
    summary = {mode: {k: statistics.median(r[k] for r in rs) for k in rs[0]} for mode, rs in rows.items()}
    ratio = summary["n"]["decode_tok_s"] / summary["separate"]["decode_tok_s"]
    out = {"command": " ".join(cmd),
           "settings": {k: (str(v) if isinstance(v, Path) else v) for k, v in vars(a).items()},
           "rounds": rows, "median": summary, "n_over_separate_decode": round(ratio, 3)}
    a.out.parent.mkdir(parents=True, exist_ok=True)
    a.out.write_text(json.dumps(out, indent=2))
    for mode, s in summary.items():
        print(f"{mode:9s} decode {s['decode_tok_s']:8.1f} tok/s  wall {s['wall_s']:6.2f} s  "
              f"prompt computed {s['computed_prompt_tokens']:.0f} of {s['prompt_tokens']:.0f} per request")
    print(f"n={a.n} / {a.n} separate decode tok/s: {ratio:.3f}")
    print("wrote", a.out)


if __name__ == "__main__":
    main()
