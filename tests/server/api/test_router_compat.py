"""What routers read from a worker (SMG, vllm-router): `/version` (so a worker whose
`owned_by` they do not know is classed as vLLM-compatible), vLLM's metric names beside ours,
and SGLang's `/flush_cache`."""

from __future__ import annotations

import httpx
from prometheus_client.parser import text_string_to_metric_families

VLLM_NAMES = {"vllm:num_requests_running", "vllm:num_requests_waiting", "vllm:kv_cache_usage_perc",
              "vllm:gpu_cache_usage_perc", "vllm:gpu_prefix_cache_hit_rate", "vllm:prefix_cache_queries",
              "vllm:prefix_cache_hits"}


def _scrape(base_url: str) -> dict[str, float]:
    text = httpx.get(base_url + "/metrics", timeout=30).text
    return {s.name: s.value for fam in text_string_to_metric_families(text) for s in fam.samples}


def test_version_answers_without_a_key(arbor_server):
    r = httpx.get(arbor_server.base_url + "/version", timeout=30)
    assert r.status_code == 200 and r.json()["version"] and "arbor-server" in r.json()["build"]


def test_vllm_metric_names_follow_the_server(arbor_server):
    before = _scrape(arbor_server.base_url)
    names = {n.removesuffix("_total") for n in before}
    assert VLLM_NAMES <= names, VLLM_NAMES - names
    assert before["llamacpp:requests_processing"] == before["vllm:num_requests_running"]
    assert 0.0 <= before["vllm:kv_cache_usage_perc"] <= 1.0
    body = {"messages": [{"role": "user", "content": "Say one word about tides."}], "max_tokens": 2}
    for _ in range(2):  # the second finds the first's prefix in its slot
        assert httpx.post(arbor_server.v1 + "/chat/completions", json=body, timeout=120).status_code == 200
    after = _scrape(arbor_server.base_url)
    queries = after["vllm:prefix_cache_queries_total"] - before["vllm:prefix_cache_queries_total"]
    hits = after["vllm:prefix_cache_hits_total"] - before["vllm:prefix_cache_hits_total"]
    computed = after["llamacpp:prompt_tokens_total"] - before["llamacpp:prompt_tokens_total"]
    assert hits > 0 and queries == hits + computed, (queries, hits, computed)
    assert 0.0 < after["vllm:gpu_prefix_cache_hit_rate"] <= 1.0


def test_sglang_flush_cache_is_the_cache_flush(arbor_server):
    r = httpx.post(arbor_server.base_url + "/flush_cache", timeout=60)
    assert r.status_code == 200 and "flushed" in r.json(), r.text
