"""Restore from the shared KV tier against computing, on a replica that never saw the prefix.

Replica 1 computes a ~400-token prefix and writes it back (its only slot is taken by another
prompt), so the prefix reaches the store; replica 1 stops. A fresh replica 2 then answers, in
turn, the prefix with a new question (from the store: source R, after `/cache/flush` so no
local copy is left) and a novel prefix of the same length (computed), `--rounds` times each.
Prints each request's prompt time (`timings.prompt_ms`: the read ahead, the restore and the
computed tail for R) and the store's lookup figures.

    python -m bench.shared_restore [--rounds 3] [--words 400] [--threads 2]
"""

from __future__ import annotations

import argparse
import random
import statistics
import tempfile
from pathlib import Path

import httpx

from harness.serving.redis_store import start_redis
from harness.serving.servers import arbor_command, free_port, running

WORDS = "pump valve sensor alarm shift report pressure flow tank motor fan belt filter relay switch panel cable".split()


def text(seed: int, words: int) -> str:
    rng = random.Random(seed)
    return "Plant log. " + " ".join(rng.choice(WORDS) for _ in range(words))


def ask(base_url: str, prompt: str) -> dict:
    r = httpx.post(base_url + "/v1/completions", timeout=600,
                   json={"prompt": prompt, "max_tokens": 1, "temperature": 0})
    r.raise_for_status()
    got = r.json()
    return {"prompt_ms": got["timings"]["prompt_ms"], "restore_ms": got["arbor"]["cache"]["restore_ms"],
            "source": got["arbor"]["cache"]["source"],
            "cached": got["usage"]["prompt_tokens_details"]["cached_tokens"], "tokens": got["usage"]["prompt_tokens"]}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--words", type=int, default=400)
    ap.add_argument("--threads", type=int, default=2)
    a = ap.parse_args()
    args = ["--threads", str(a.threads), "--parallel", "1", "--ctx-size", "4096", "--cache-min-tokens", "16"]
    prefix = text(0, a.words)
    with tempfile.TemporaryDirectory() as tmp:
        logs = Path(tmp)
        store = start_redis(logs, "1gb")
        try:
            args += ["--cache-shared", store.url, "--cache-shared-secret", store.secret]
            port = free_port()
            with running("replica-1", arbor_command(port, None, args), port, logs) as r1:
                ask(r1.base_url, prefix + " end.")
                ask(r1.base_url, "another prompt")  # takes the slot: the prefix is written back, then to R
            # stopping replica 1 waited for its shared-store writer to finish
            port = free_port()
            with running("replica-2", arbor_command(port, None, args), port, logs) as r2:
                ask(r2.base_url, "warm up")
                rows = []
                for i in range(a.rounds):
                    httpx.post(r2.base_url + "/cache/flush", timeout=60).raise_for_status()
                    shared = ask(r2.base_url, prefix + f" question {i}?")
                    httpx.post(r2.base_url + "/cache/flush", timeout=60).raise_for_status()
                    computed = ask(r2.base_url, text(100 + i, a.words) + f" question {i}?")
                    rows.append((shared, computed))
                    print(f"round {i}: shared {shared}  computed {computed}", flush=True)
                st = httpx.get(r2.base_url + "/cache/stats", timeout=60).json()["tiers"]["R"]
        finally:
            store.stop()
    print(f"median prompt ms: from the store {statistics.median(s['prompt_ms'] for s, _ in rows):.0f}, "
          f"computed {statistics.median(c['prompt_ms'] for _, c in rows):.0f}")
    print(f"lookups {st['lookups']}, {st['lookup_ms_total']:.2f} ms in all, the slowest {st['max_lookup_ms']:.2f} ms; "
          f"hits {st['hits']}, errors {st['errors']}")


if __name__ == "__main__":
    main()
