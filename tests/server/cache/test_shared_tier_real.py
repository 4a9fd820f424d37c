"""Tier R with real processes (issue 23, item 2): a redis-server and arbor-servers of the
embedded model.

- A prefix computed on replica 1 reaches the store when its slot is written back; replica 1
  is stopped; a fresh replica 2 answers the next turn with `cached_tokens > 0` from the
  shared tier (source R), and the same greedy answer as a `--no-cache` server computing it.
- The store stopped mid-run: every request still answers 200 (computed), /health stays
  green, and the failures are counted in `arbor:cache_shared_errors_total`.
"""

from __future__ import annotations

import random
import time

import httpx
import pytest

from bench.soak import metrics
from harness.serving.redis_store import SHARED_SECRET
from tests.server.cache.redis_store import start_redis
from tests.server.conftest import RunningServer, start_server, stop_server

pytestmark = pytest.mark.model

CHUNK = 64
MAX_TOKENS = 12
WORDS = ("pump valve sensor alarm shift report pressure flow tank motor fan belt filter relay switch panel cable "
         "bearing seal gauge meter line crew ticket").split()


def text(seed: int, words: int) -> str:
    rng = random.Random(seed)
    return f"Log {seed}: " + " ".join(rng.choice(WORDS) for _ in range(words)) + "\nSummary:"


PASSWORD = "store-password-0123"  # the store asks for one, as compose.scale.yaml's does


def replica_args(url: str) -> list[str]:
    return ["--parallel", "1", "--ctx-size", "2048", "--batch-size", "128", "--cache-tiers", "A,S,H",
            "--cache-ram", "64", "--cache-min-tokens", "16", "--cache-shared", url,
            "--cache-shared-chunk", str(CHUNK), "--cache-shared-secret", SHARED_SECRET]


def complete(server: RunningServer, prompt: str) -> dict:
    r = httpx.post(server.v1 + "/completions", timeout=180,
                   json={"prompt": prompt, "max_tokens": MAX_TOKENS, "temperature": 0})
    assert r.status_code == 200, r.text[:2000]
    return r.json()


def shared_stats(server: RunningServer) -> dict:
    return httpx.get(server.base_url + "/cache/stats", timeout=60).json()["tiers"]["R"]


def wait_written(server: RunningServer, chunks: int) -> dict:
    deadline = time.monotonic() + 60
    while True:
        st = shared_stats(server)
        if st["stored_chunks"] >= chunks and st["pending_writes"] == 0 and st["pending_bytes"] == 0:
            return st
        assert time.monotonic() < deadline, f"the shared store never got {chunks} chunks: {st}"
        time.sleep(0.1)


def test_a_prefix_computed_on_one_replica_is_restored_on_another(tmp_path):
    import redis

    store = start_redis(tmp_path)
    redis.Redis(port=store.port).config_set("requirepass", PASSWORD)
    url = f"redis://:{PASSWORD}@127.0.0.1:{store.port}/0"
    turn1 = text(1, 150)  # ~300 tokens: several whole chunks
    try:
        r1 = start_server(tmp_path, *replica_args(url))
        try:
            first = complete(r1, turn1)
            complete(r1, text(2, 30))  # takes the only slot: turn 1's KV is written back (H, then R)
            st = wait_written(r1, 2)
            assert st["errors"] == 0
            assert st["url"] == f"redis://:***@127.0.0.1:{store.port}/0"  # /cache/stats never shows the password
        finally:
            stop_server(r1)
        turn2 = turn1 + first["choices"][0]["text"] + "\nNext entry:"

        r2 = start_server(tmp_path, *replica_args(url))
        try:
            got = complete(r2, turn2)
            cached = got["usage"]["prompt_tokens_details"]["cached_tokens"]
            assert got["arbor"]["cache"]["source"] == "R", got["arbor"]
            assert cached >= 2 * CHUNK and cached % CHUNK == 0, got["usage"]
            st = shared_stats(r2)
            assert st["hits"] == 1
            print(f"\nshared tier: {cached} of {got['usage']['prompt_tokens']} prompt tokens from R, "
                  f"restore {got['arbor']['cache']['restore_ms']:.1f} ms (read + restore), "
                  f"prompt {got.get('timings', {}).get('prompt_ms')} ms; lookups {st['lookups']}, "
                  f"max {st['max_lookup_ms']:.2f} ms")

            # The store stops mid-run: requests compute, nothing fails, the failures are counted.
            before = metrics(r2.base_url).get("arbor:cache_shared_errors_total", 0)
            statuses = []
            for i in range(4):
                if i == 1:
                    store.stop()
                r = httpx.post(r2.v1 + "/completions", timeout=180,
                               json={"prompt": text(10 + i, 60), "max_tokens": 4, "temperature": 0})
                statuses.append(r.status_code)
                assert httpx.get(r2.base_url + "/health", timeout=10).status_code == 200
            assert statuses == [200] * 4
            assert metrics(r2.base_url)["arbor:cache_shared_errors_total"] > before
        finally:
            stop_server(r2)
        for server in (r1, r2):  # the failures were logged, the password never
            assert PASSWORD not in server.log()
        assert "redis://:***@" in r2.log()

        ref = start_server(tmp_path, "--parallel", "1", "--ctx-size", "2048", "--batch-size", "128", "--no-cache")
        try:
            want = complete(ref, turn2)
        finally:
            stop_server(ref)
        print(f"recompute (--no-cache): prompt {want.get('timings', {}).get('prompt_ms')} ms")
        assert got["choices"][0]["text"] == want["choices"][0]["text"]
    finally:
        store.stop()
