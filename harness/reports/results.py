"""Typed replay results and their JSON file format (``arbor-replay/1``).

A results file is ``{"format": "arbor-replay/1", "metadata": {...}, "summary": {...},
"requests": [RequestResult, ...]}``; ``compare.py`` and the workbench read it back.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path
from typing import Any

RESULTS_FORMAT = "arbor-replay/1"


@dataclass
class RequestResult:
    """One replayed request. Times are seconds; ``start_s`` is relative to the run's start."""

    index: int
    session_id: str
    branch_id: str | None
    scheduled_t: float
    start_s: float | None = None
    ttft_s: float | None = None
    latency_s: float | None = None
    prompt_tokens: int | None = None
    completion_tokens: int | None = None
    cached_tokens: int | None = None
    #: where ``cached_tokens`` came from: "usage" (prompt_tokens_details) or "timings" (cache_n)
    cached_tokens_from: str | None = None
    #: ``arbor.cache.source`` when the server reports it (A, S, H, D or none)
    cache_source: str | None = None
    finish_reason: str | None = None
    status: int | None = None
    error: str | None = None
    #: the API the request went to (chat, responses, messages; harness/manifest.py)
    api: str = "chat"

    @property
    def ok(self) -> bool:
        return self.error is None

    @property
    def computed_tokens(self) -> int | None:
        """Prompt tokens the server ran through the model (prompt - cached)."""
        if self.prompt_tokens is None:
            return None
        return self.prompt_tokens - (self.cached_tokens or 0)


@dataclass
class RunResult:
    """A whole replay: metadata (server, settings, time), summary, per-request results."""

    metadata: dict[str, Any]
    summary: dict[str, Any]
    requests: list[RequestResult] = field(default_factory=list)

    def to_dict(self) -> dict[str, Any]:
        return {"format": RESULTS_FORMAT, "metadata": self.metadata, "summary": self.summary,
                "requests": [asdict(r) for r in self.requests]}

    def save(self, path: str | Path) -> Path:
        path = Path(path)
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(self.to_dict(), indent=2) + "\n", encoding="utf-8")
        return path


_REQUEST_FIELDS = {f.name for f in fields(RequestResult)}


def load_results(path: str | Path) -> RunResult:
    """Read a results file written by :meth:`RunResult.save`; clear error on anything else."""
    path = Path(path)
    try:
        document = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, json.JSONDecodeError) as exc:
        raise ValueError(f"{path}: cannot read replay results ({exc})") from exc
    if not isinstance(document, dict) or document.get("format") != RESULTS_FORMAT:
        raise ValueError(f"{path}: not an arbor replay results file (expected format {RESULTS_FORMAT!r})")
    requests = [RequestResult(**{k: v for k, v in r.items() if k in _REQUEST_FIELDS})
                for r in document.get("requests", [])]
    return RunResult(metadata=document.get("metadata", {}), summary=document.get("summary", {}), requests=requests)
