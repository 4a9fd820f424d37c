"""Chunk size of the shared KV tier (tier R, server/cache/shared_tier.py), measured against a
real redis-server on this machine.

For each chunk size: a 4096-token prompt's KV (the embedded model's layout: 30 layers x
(K + V) x 384 bytes = 23 040 bytes per token, f16) is written through `SharedTier.store`
(encode + EXISTS + pipelined SETs on the writer thread), looked up (one pipelined EXISTS of
every chunk key: what admission pays on the engine thread) and read back (`load`: one MGET
plus the checks and decoding). Only whole chunks are shared, so a restore leaves on average
chunk/2 tokens of a prompt's shared prefix to compute: `tail_ms` is that at `--prefill-tps`.

    python -m bench.shared_chunk [--tokens 4096] [--prefill-tps 150]
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from pathlib import Path

import numpy as np

from harness.serving.redis_store import SHARED_SECRET, start_redis
from server.cache.kv_format import KVLayout, KVSegment
from server.cache.path_kv import HeldKV
from server.cache.shared_tier import SharedTier

N_LAYER, ROW = 30, 384  # SmolLM2-135M (the embedded model): 3 KV heads x 64 x f16
LAYOUT = KVLayout(False, (1,) * N_LAYER, (ROW,) * N_LAYER, (1,) * N_LAYER, (ROW,) * N_LAYER, (0,) * N_LAYER)


def segment(n: int) -> KVSegment:
    rng = np.random.default_rng(0)
    arrays = [rng.integers(0, 255, (n, ROW), dtype=np.uint8) for _ in range(2 * N_LAYER)]
    return KVSegment(LAYOUT, 0, arrays[:N_LAYER], arrays[N_LAYER:])


def measure(url: str, chunk: int, tokens: list[int], seg: KVSegment, prefill_tps: float) -> dict:
    import redis

    redis.Redis.from_url(url).flushdb()
    tier = SharedTier(url, f"bench{chunk}", chunk, secret=SHARED_SECRET, lookup_timeout_s=1.0)
    try:
        t0 = time.perf_counter()
        tier.store(tokens, HeldKV([(0, seg)]))
        tier.wait_idle()
        write_s = time.perf_counter() - t0
        lookups = []
        for _ in range(20):
            t0 = time.perf_counter()
            m = tier.lookup(tokens)
            lookups.append(time.perf_counter() - t0)
        reads = []
        for _ in range(5):
            t0 = time.perf_counter()
            tier.load(m)
            reads.append(time.perf_counter() - t0)
        assert m.length == len(tokens) and tier.errors == 0, (m.length, tier.stats())
        mb = seg.nbytes / 1e6
        return {"chunk": chunk, "keys": len(tokens) // chunk, "write_MBps": mb / write_s,
                "lookup_ms": 1000 * statistics.median(lookups), "read_ms": 1000 * statistics.median(reads),
                "read_MBps": mb / statistics.median(reads), "tail_ms": 1000 * (chunk / 2) / prefill_tps}
    finally:
        tier.close()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--tokens", type=int, default=4096)
    ap.add_argument("--prefill-tps", type=float, default=150.0, help="prompt tokens/s of the model here")
    ap.add_argument("--chunks", default="16,32,64,128,256,512,1024")
    a = ap.parse_args()
    tokens = list(range(a.tokens))
    seg = segment(a.tokens)
    with tempfile.TemporaryDirectory() as tmp:
        store = start_redis(Path(tmp), maxmemory="1gb")
        try:
            rows = [measure(store.url, int(c), tokens, seg, a.prefill_tps) for c in a.chunks.split(",")]
        finally:
            store.stop()
    print(f"{a.tokens} tokens, {seg.nbytes / 1e6:.1f} MB of KV, prefill {a.prefill_tps:.0f} tok/s")
    print("| chunk | keys | write MB/s | lookup ms (EXISTS x keys) | read ms (STRLEN + GETRANGE + MAC + checks) "
          "| read MB/s "
          "| tail computed, ms (chunk/2) |")
    print("|---:|---:|---:|---:|---:|---:|---:|")
    for r in rows:
        print(f"| {r['chunk']} | {r['keys']} | {r['write_MBps']:.0f} | {r['lookup_ms']:.2f} | {r['read_ms']:.1f} "
              f"| {r['read_MBps']:.0f} | {r['tail_ms']:.0f} |")


if __name__ == "__main__":
    main()
