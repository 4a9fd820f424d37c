"""What every protocol reports of a finished generation beside its own usage: llama-server's
`timings` and Arbor's `arbor` extension (where the prompt's KV came from)."""

from __future__ import annotations

from typing import Any

from server.engine.sequence import Finished


def timings(fin: Finished) -> dict[str, Any]:
    prompt_n = fin.prompt_tokens - fin.cached_tokens
    return {
        "cache_n": fin.cached_tokens,
        "prompt_n": prompt_n,
        "prompt_ms": round(fin.prompt_ms, 3),
        "prompt_per_second": prompt_n / (fin.prompt_ms / 1000.0) if fin.prompt_ms > 0 else 0.0,
        "predicted_n": fin.completion_tokens,
        "predicted_ms": round(fin.predicted_ms, 3),
        "predicted_per_second": fin.completion_tokens / (fin.predicted_ms / 1000.0) if fin.predicted_ms > 0 else 0.0,
        # speculative decoding (llama-server's names): tokens drafted for the request, and accepted by the target
        "draft_n": fin.draft_n,
        "draft_n_accepted": fin.draft_n_accepted,
    }


def arbor_extension(fin: Finished) -> dict[str, Any]:
    c = fin.cache
    return {
        "cache": {
            "source": c.source,
            "reused_tokens": c.reused_tokens,
            "restored_bytes": c.restored_bytes,
            "restore_ms": round(c.restore_ms, 3),
            "plan": c.plan,
            "est_ms": None if c.est_ms is None else round(c.est_ms, 3),
        }
    }
