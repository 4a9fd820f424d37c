"""vLLM-named aliases of arbor-server's load and cache figures, for routers that read them.

Cache-aware routers scrape a worker's `/metrics` for vLLM's names: SMG (`smg`, the successor
of SGLang's router) reads `vllm:num_requests_running`, `vllm:num_requests_waiting`,
`vllm:kv_cache_usage_perc` (v1) or `vllm:gpu_cache_usage_perc` (v0; it needs one of the two
or it treats the worker's load as unknown) and `vllm:gpu_prefix_cache_hit_rate`
(model_gateway/src/worker/monitor.rs, `fetch_http_load_vllm`); vllm-router and llm-d read the
same names. These are aliases: the `llamacpp:`/`arbor:` metrics stay the source of truth.

Meanings, where Arbor's figure is not vLLM's:
- KV usage is the fraction of the unified KV's cells reserved by running requests (what new
  work competes for). Resident prefixes and idle slots' kept cells are not counted: the
  cache gives them up under pressure, as vLLM's free-block pool holds evictable cached blocks.
- The prefix-cache hit rate is cumulative: reused prompt tokens / prompt tokens since start
  (vLLM v0's gauge); v1's `vllm:prefix_cache_queries`/`vllm:prefix_cache_hits` counters carry
  the same two totals so a scraper can take rates.
"""

from __future__ import annotations

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

MODEL_LABEL = "model_name"  # vLLM labels every metric with the served model's name


class VllmAliases:
    """A prometheus_client collector, read at scrape time from the server state."""

    def __init__(self, state) -> None:
        self._state = state

    def collect(self):
        loaded = self._state.loaded
        if loaded is None:
            return
        name = self._state.model_name
        stats = loaded.engine.stats()
        cells = max(1, self._state.settings.ctx_size)
        usage = min(1.0, loaded.engine.scheduler.reserved_cells / cells)
        computed, reused = _prompt_totals(self._state.metrics)
        queries = computed + reused

        def gauge(metric: str, doc: str, value: float) -> GaugeMetricFamily:
            g = GaugeMetricFamily(metric, doc, labels=[MODEL_LABEL])
            g.add_metric([name], value)
            return g

        yield gauge("vllm:num_requests_running", "Requests running (alias of llamacpp:requests_processing).",
                    stats.n_running)
        yield gauge("vllm:num_requests_waiting", "Requests waiting for a slot (alias of llamacpp:requests_deferred).",
                    stats.n_waiting)
        yield gauge("vllm:kv_cache_usage_perc", "Fraction of KV cells reserved by running requests (1 = full).",
                    usage)
        yield gauge("vllm:gpu_cache_usage_perc", "vLLM v0 name of vllm:kv_cache_usage_perc.", usage)
        yield gauge("vllm:gpu_prefix_cache_hit_rate", "Reused prompt tokens / prompt tokens since start.",
                    reused / queries if queries else 0.0)
        for metric, doc, value in (("vllm:prefix_cache_queries", "Prompt tokens looked up in the prefix cache.",
                                    queries),
                                   ("vllm:prefix_cache_hits", "Prompt tokens reused from the prefix cache.", reused)):
            c = CounterMetricFamily(metric, doc, labels=[MODEL_LABEL])
            c.add_metric([name], value)
            yield c

    def describe(self):
        return []  # collected lazily: the model may not be loaded at registration


def _prompt_totals(metrics) -> tuple[float, float]:
    """(computed, reused) prompt tokens so far, read from the `llamacpp:prompt_tokens` counter
    (computed tokens only) and `arbor:cache_reused_tokens` (per source)."""
    return _counter_total(metrics.prompt_tokens), _counter_total(metrics.cached_tokens)


def _counter_total(counter) -> float:
    return sum(s.value for fam in counter.collect() for s in fam.samples if s.name.endswith("_total"))
