"""Prometheus metrics. Names follow llama-server's `llamacpp:` metrics where they mean the
same thing; cache metrics use the `arbor:` prefix. One registry per server instance."""

from __future__ import annotations

from collections.abc import Callable

from prometheus_client import CollectorRegistry, Counter, Histogram
from prometheus_client.core import GaugeMetricFamily

from server.engine.sequence import Finished


class _LiveGauges:
    """Gauges read at scrape time from the engine (and the cache, once it is wired)."""

    def __init__(self, read: Callable[[], dict[str, tuple[str, float]]]):
        self._read = read

    def collect(self):
        for name, (doc, value) in self._read().items():
            g = GaugeMetricFamily(name, doc)
            g.add_metric([], value)
            yield g

    def describe(self):
        return []


class ServerMetrics:
    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        r = self.registry
        self.prompt_tokens = Counter("llamacpp:prompt_tokens", "Number of prompt tokens processed.", registry=r)
        self.prompt_seconds = Counter("llamacpp:prompt_seconds", "Prompt process time.", registry=r)
        self.tokens_predicted = Counter("llamacpp:tokens_predicted", "Number of generation tokens processed.",
                                        registry=r)
        self.tokens_predicted_seconds = Counter(
            "llamacpp:tokens_predicted_seconds", "Predict process time.", registry=r
        )
        self.requests = Counter("arbor:requests", "Finished requests by finish reason.", ["reason"], registry=r)
        self.abandoned = Counter(
            "arbor:requests_abandoned", "Generations stopped because their client left before the end "
            "(a disconnect while queued, prefilling or decoding; each choice of a request counts).", registry=r)
        self.cached_tokens = Counter(
            "arbor:cache_reused_tokens", "Prompt tokens reused from a cache source.", ["source"], registry=r
        )
        # speculative decoding, per finished request (llama-server's names for the counts in `timings`)
        self.draft_tokens = Counter("arbor:draft_tokens", "Tokens drafted for speculative decoding.", registry=r)
        self.draft_tokens_accepted = Counter(
            "arbor:draft_tokens_accepted", "Drafted tokens the target accepted (speculative decoding).", registry=r)
        self.ttft = Histogram(
            "arbor:time_to_first_token_seconds", "Time from admission to the first token.",
            buckets=(0.05, 0.1, 0.25, 0.5, 1, 2, 4, 8, 16, 32, 64), registry=r,
        )

    def add_live_gauges(self, read: Callable[[], dict[str, tuple[str, float]]]) -> None:
        self.registry.register(_LiveGauges(read))

    def observe(self, fin: Finished) -> None:
        self.requests.labels(fin.finish_reason).inc()
        computed = fin.prompt_tokens - fin.cached_tokens
        self.prompt_tokens.inc(computed)
        self.prompt_seconds.inc(fin.prompt_ms / 1000.0)
        self.tokens_predicted.inc(fin.completion_tokens)
        self.tokens_predicted_seconds.inc(fin.predicted_ms / 1000.0)
        self.cached_tokens.labels(fin.cache.source).inc(fin.cached_tokens)
        self.draft_tokens.inc(fin.draft_n)
        self.draft_tokens_accepted.inc(fin.draft_n_accepted)
        if fin.finish_reason in ("stop", "length"):
            self.ttft.observe(fin.prompt_ms / 1000.0)
