"""Summary statistics of a replay: latency percentiles, throughput, token accounting."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from harness.reports.results import RequestResult
from harness.workloads.ideal import IdealResult


def _stats(values: Sequence[float]) -> dict[str, float | None]:
    if not values:
        return {"p50": None, "p95": None, "mean": None, "max": None}
    array = np.asarray(values, dtype=float)
    return {"p50": float(np.percentile(array, 50)), "p95": float(np.percentile(array, 95)),
            "mean": float(array.mean()), "max": float(array.max())}


def summarize(requests: Sequence[RequestResult], wall_s: float, ideal: IdealResult | None = None) -> dict[str, Any]:
    """Summary over ``requests`` (errors counted, excluded from timings and tokens).

    ``ideal`` in unit ``tokens`` is compared directly with computed prompt tokens; an ideal in
    ``words`` only gives an estimate (its fraction of the total applied to the server's
    prompt token count), reported as ``computed_over_ideal_estimate``.
    """
    ok = [r for r in requests if r.ok]
    prompt = sum(r.prompt_tokens or 0 for r in ok)
    cached = sum(r.cached_tokens or 0 for r in ok)
    completion = sum(r.completion_tokens or 0 for r in ok)
    computed = prompt - cached
    sources: dict[str, int] = {}
    for r in ok:
        if r.cache_source is not None:
            sources[r.cache_source] = sources.get(r.cache_source, 0) + 1
    summary: dict[str, Any] = {
        "requests": len(requests),
        "ok": len(ok),
        "errors": len(requests) - len(ok),
        "wall_s": wall_s,
        "ttft_s": _stats([r.ttft_s for r in ok if r.ttft_s is not None]),
        "latency_s": _stats([r.latency_s for r in ok if r.latency_s is not None]),
        # a turn's two halves: prefill (to the first token, queueing included) and decode (first token to the end),
        # summed over the requests; decode is what speculative decoding shortens
        "prefill_s": sum(r.ttft_s for r in ok if r.ttft_s is not None),
        "decode_s": sum(r.latency_s - r.ttft_s for r in ok if r.latency_s is not None and r.ttft_s is not None),
        "throughput": {
            "requests_per_s": len(ok) / wall_s if wall_s > 0 else None,
            "output_tokens_per_s": completion / wall_s if wall_s > 0 else None,
        },
        "tokens": {"prompt": prompt, "cached": cached, "computed": computed, "completion": completion,
                   "cached_fraction": cached / prompt if prompt else None},
        "cache_sources": sources,
        "requests_without_usage": sum(1 for r in ok if r.prompt_tokens is None),
    }
    if ideal is not None:
        block: dict[str, Any] = ideal.to_dict()
        if ideal.unit == "tokens":
            best = ideal.ideal_computed_tokens
            block["computed_over_ideal"] = computed / best if best else None
            # The ideal is computed on all requests; if some failed the ratio is not comparable.
            # The ideal covers every request; with failures the ratio is not comparable.
            block["complete"] = len(ok) == len(requests)
        else:
            estimate = prompt * ideal.ideal_fraction
            block["computed_over_ideal_estimate"] = computed / estimate if estimate else None
        summary["ideal"] = block
    return summary
