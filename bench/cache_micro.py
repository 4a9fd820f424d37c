"""Cache micro-benchmarks on the real engine (issue 3, items 3-5), in one process:

1. device KV: 4 concurrent requests with prompts sharing their first half: KV cells used
   against the union bound and against no sharing;
2. host bytes: 8 prompts sharing their first half stored in tier H, against per-sequence
   state snapshots;
3. storing N tokens into host RAM and restoring them from host RAM and from disk, in
   bytes/s, against recomputing them.

    python -m bench.cache_micro [--prompt 2048] [--restore-tokens 1024] [--model M.gguf --n-gpu-layers 999]

With the model offloaded, "store" is llama.cpp's device-to-host copy and "restore" the copy back.
"""

from __future__ import annotations

import argparse
import json
import tempfile
import time
from pathlib import Path

from server import bootstrap
from server.cache.disk_tier import encode_segment, read_segment_file, write_segment_file
from server.cache.resident import union_positions
from server.engine.llama_runtime import BatchEntry
from server.settings import ServerSettings
from tests.server.cache.engine_harness import generate_many, kept_cells, reset_kv, used_cells


def words(n: int, seed: int) -> str:
    vocab = ["pump", "valve", "sensor", "drift", "alarm", "reading", "shift", "report", "node", "fleet"]
    return " ".join(f"{vocab[(i * 7 + seed) % len(vocab)]}{(i + seed) % 97}" for i in range(n))


def tokens_of(model, text: str, n: int) -> list[int]:
    toks = model.runtime.tokenize(text, add_special=False, parse_special=False)
    if len(toks) < n:
        raise ValueError("text too short")
    return toks[:n]


def device_kv(model, prompt_len: int) -> dict:
    reset_kv(model)
    half = prompt_len // 2
    shared = tokens_of(model, words(prompt_len, 0), half)
    prompts = [shared + tokens_of(model, words(prompt_len, 100 + i), prompt_len - half) for i in range(4)]
    t0 = time.perf_counter()
    results = generate_many(model, prompts, max_tokens=2)
    wall = time.perf_counter() - t0
    cells = used_cells(model)
    slot_tokens = [list(s.tokens) for s in model.slots.slots if s.tokens]
    bound = union_positions(slot_tokens + ([o.tokens for o in model.router.resident.owners]
                                           if model.router.resident else []))
    no_sharing = sum(len(t) for t in slot_tokens)
    return {"prompt_tokens": prompt_len, "requests": 4, "used_cells": cells, "union_bound": bound,
            "bookkept": kept_cells(model), "no_sharing_cells": no_sharing,
            "cells_over_bound": cells / bound, "reduction_vs_no_sharing": 1 - cells / no_sharing,
            "sources": [r.final.cache.source for r in results], "wall_s": wall}


def host_bytes(model, prompt_len: int) -> dict:
    reset_kv(model)
    model.engine.run_exclusive(model.router.host.flush)
    half = prompt_len // 2
    shared = tokens_of(model, words(prompt_len, 1), half)
    prompts = [shared + tokens_of(model, words(prompt_len, 200 + i), prompt_len - half) for i in range(8)]
    snapshot_bytes = 0
    stored: list[list[int]] = []
    for p in prompts:
        generate_many(model, [p], max_tokens=1)
        slot = max(model.slots.slots, key=lambda s: s.last_used)
        snapshot_bytes += len(model.engine.run_exclusive(lambda slot=slot: model.runtime.state_seq_get(slot.seq_id)))
        stored.append(list(slot.tokens))
    reset_kv(model)  # write-back: the prompts reach tier H when their device copies go
    st = model.router.host.stats()
    per_token = st["bytes"] / st["tokens"]
    bound_bytes = union_positions(stored) * per_token
    return {"prompts": 8, "prompt_tokens": prompt_len, "host_bytes": st["bytes"], "union_bound_bytes": bound_bytes,
            "per_sequence_snapshot_bytes": snapshot_bytes, "bytes_over_bound": st["bytes"] / bound_bytes,
            "reduction_vs_snapshots": 1 - st["bytes"] / snapshot_bytes}


def restore_vs_recompute(model, n: int, repeats: int = 5) -> dict:
    """Recompute N tokens vs restore them from host RAM (one segment, and the same KV as
    two segments, which needs a join) and from a disk file; store = extract into tier H's
    form (seq_cp + llama.cpp's state copy + parse into views). Store and restore: best of
    `repeats`; recompute: once (it is slow and only the ratio's denominator)."""
    rt, kv = model.runtime, model.router.kv
    toks = tokens_of(model, words(n + 50, 3), n)
    slot = model.slots.slots[0].seq_id
    best: dict[str, float] = {}

    def timed(name, fn):
        t0 = time.perf_counter()
        out = fn()
        best[name] = min(best.get(name, float("inf")), time.perf_counter() - t0)
        return out

    def job():
        def compute():
            for i in range(0, n, rt.n_batch):
                chunk = toks[i:i + rt.n_batch]
                rt.decode([BatchEntry(t, i + j, slot, False) for j, t in enumerate(chunk)])

        rt.seq_rm(slot, -1, -1)
        timed("recompute", compute)
        with tempfile.TemporaryDirectory() as tmp:
            for _ in range(repeats):
                seg = timed("host_store", lambda: kv.extract(slot, 0, n))
                f = write_segment_file(Path(tmp), encode_segment("bench", toks, seg))
                rt.seq_rm(slot, -1, -1)
                for name, segs in (("host_restore", lambda seg=seg: [seg]),
                                   ("host_restore_joined", lambda seg=seg: list(seg.split(n // 2))),
                                   ("disk_restore", lambda f=f: [read_segment_file(f.path, "bench")])):
                    rt.seq_rm(slot, -1, -1)
                    timed(name, lambda segs=segs: kv.restore(segs(), slot))
        rt.seq_rm(slot, -1, -1)
        model.slots.slots[0].tokens = []
        return seg.nbytes

    nbytes = model.engine.run_exclusive(job)
    out = {"tokens": n, "bytes": nbytes, "bytes_per_token": nbytes // n}
    for name, secs in best.items():
        out[f"{name}_s"] = secs
        if name != "recompute":
            out[f"{name}_bytes_per_s"] = nbytes / secs
            out[f"{name}_speedup_vs_recompute"] = best["recompute"] / secs
    out["recompute_tokens_per_s"] = n / best["recompute"]
    return out


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--prompt", type=int, default=2048)
    p.add_argument("--host-prompt", type=int, default=512)
    p.add_argument("--restore-tokens", type=int, default=1024)
    p.add_argument("--model", type=Path, default=None, help="GGUF file (default: the embedded model)")
    p.add_argument("--n-gpu-layers", type=int, default=0, help="layers to offload (999: all)")
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--out", type=Path, default=Path("bench/results/cache_micro.json"))
    a = p.parse_args(argv)
    ctx = 4 * (a.prompt + 64)
    model = bootstrap.load(ServerSettings(model=a.model, n_gpu_layers=a.n_gpu_layers, parallel=4, ctx_size=ctx,
                                          batch_size=512, threads=a.threads,
                                          cache_tiers=("A", "S", "H"), cache_min_tokens=16, resident_cells=a.prompt))
    try:
        out = {"model": str(a.model or "embedded"), "n_gpu_layers": a.n_gpu_layers,
               "restore_vs_recompute": restore_vs_recompute(model, a.restore_tokens)}
        print(json.dumps(out["restore_vs_recompute"]), flush=True)
        out["host_bytes"] = host_bytes(model, a.host_prompt)
        print(json.dumps(out["host_bytes"]), flush=True)
        out["device_kv"] = device_kv(model, a.prompt)
        print(json.dumps(out["device_kv"]), flush=True)
    finally:
        model.close()
    a.out.parent.mkdir(parents=True, exist_ok=True)
    a.out.write_text(json.dumps(out, indent=2))
    print("wrote", a.out)


if __name__ == "__main__":
    main()
