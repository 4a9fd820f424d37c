"""What unified KV costs: a bare llama_decode loop over N sequences, unified against split
streams, in one process, same model, same tokens.

    python -m bench.unified_vs_split [--model M.gguf] [--seqs 4] [--tokens 20] [--prompt 64]

Each sequence first gets a prompt of --prompt tokens, then --tokens decode steps run with one
token per sequence per batch. Resident sharing needs unified KV (seq_cp shares cells only
within one stream), so its cost in decode speed is ours to know. Four configurations, in
turns: split streams, unified KV with llama.cpp's attention over every cell, unified KV with
paged attention (`--page-size` cells a page; our llama.cpp patch) and pages owned by one
sequence, and paged attention with llama.cpp's placement (the decode tokens of all sequences
sharing pages, llama.cpp's placement).
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path
from typing import Literal

from server.engine.llama_runtime import BatchEntry, LlamaRuntime, RuntimeConfig
from server.model_file import embedded_model_path

CONFIGS: dict[str, tuple[bool, Literal["auto", "on", "off"], Literal["owned", "shared"]]] = {
    "split": (False, "off", "owned"), "unified": (True, "off", "owned"), "unified_paged": (True, "on", "owned"),
    # paged with llama.cpp's placement: the decode tokens of all sequences share pages (llama.cpp's placement,
    # --page-placement shared)
    "unified_paged_shared_pages": (True, "on", "shared")}


def prefill_prompts(rt: LlamaRuntime, n_seqs: int, prompt_len: int) -> list[int]:
    """Give sequences 0..n_seqs-1 the same prompt of `prompt_len` tokens (chunks of 512); return it."""
    text = "The history of engineering " * max(40, prompt_len // 3)
    prompt = rt.tokenize(text, add_special=False, parse_special=False)[:prompt_len]
    for s in range(n_seqs):
        for c in range(0, len(prompt), 512):
            rt.decode([BatchEntry(t, i, s, i == len(prompt) - 1) for i, t in enumerate(prompt[c:c + 512], start=c)])
    return prompt


def decode_rate(model: Path, config: str, n_seqs: int, n_tokens: int, prompt_len: int, threads: int,
                page_size: int = 16) -> float:
    unified, paged, placement = CONFIGS[config]
    n_ctx = max(4096, n_seqs * (prompt_len + n_tokens + 64))
    rt = LlamaRuntime(RuntimeConfig(model, n_ctx=n_ctx, n_batch=512, n_seq_max=n_seqs, n_threads=threads,
                                    n_threads_batch=threads, kv_unified=unified, paged_attn=paged,
                                    page_size=page_size, page_placement=placement))
    try:
        prompt = prefill_prompts(rt, n_seqs, prompt_len)
        t0 = time.perf_counter()
        for step in range(n_tokens):
            rt.decode([BatchEntry(100 + step, len(prompt) + step, s, True) for s in range(n_seqs)])
        return n_seqs * n_tokens / (time.perf_counter() - t0)
    finally:
        rt.close()


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model", type=Path, default=None)
    p.add_argument("--seqs", type=int, default=4)
    p.add_argument("--tokens", type=int, default=20)
    p.add_argument("--prompt", type=int, default=64)
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--page-size", type=int, default=16)
    p.add_argument("--out", type=Path, default=Path("bench/results/unified_vs_split.json"))
    a = p.parse_args(argv)
    model = a.model or embedded_model_path()
    rows: dict[str, list[float]] = {c: [] for c in CONFIGS}
    for _ in range(a.repeats):  # interleaved, so drift on a shared machine hits all alike
        for config in CONFIGS:
            rows[config].append(decode_rate(model, config, a.seqs, a.tokens, a.prompt, a.threads, a.page_size))
    best = {k: max(v) for k, v in rows.items()}
    out = {"model": str(model), "seqs": a.seqs, "tokens": a.tokens, "prompt": a.prompt, "page_size": a.page_size,
           "tok_s": rows, "best_tok_s": best, "unified_over_split": best["unified"] / best["split"],
           "unified_paged_over_split": best["unified_paged"] / best["split"],
           "unified_paged_shared_pages_over_split": best["unified_paged_shared_pages"] / best["split"]}
    a.out.parent.mkdir(parents=True, exist_ok=True)
    a.out.write_text(json.dumps(out, indent=2))
    print(json.dumps(out, indent=2))


if __name__ == "__main__":
    main()
