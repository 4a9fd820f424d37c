"""Replay results files for the Replay page: `<data dir>/replay/*.json` (format arbor-replay/1).

The app hands `load_replay_runs` to the frontend (`frontend.pages.install`).

`arbor replay ... --out <data dir>/replay/NAME.json` puts a run where the page finds it.
Files that are not replay results are listed with the reason, never silently skipped.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from harness.reports.results import load_results

#: the most requests per run sent to the browser (charts of more points say nothing more)
MAX_REQUESTS_PER_RUN = 5000

_REQUEST_KEYS = ("index", "session_id", "start_s", "ttft_s", "latency_s", "prompt_tokens", "completion_tokens",
                 "cached_tokens", "cache_source", "error")


@dataclass
class ReplayRuns:
    folder: Path
    runs: list[dict[str, Any]] = field(default_factory=list)
    unreadable: list[dict[str, str]] = field(default_factory=list)


def replay_folder(data_dir: Path) -> Path:
    return Path(data_dir) / "replay"


def load_replay_runs(data_dir: Path) -> ReplayRuns:
    """Every results file in the replay folder, newest first, trimmed to what the charts use."""
    folder = replay_folder(data_dir)
    found = ReplayRuns(folder)
    if not folder.is_dir():
        return found
    files = sorted(folder.glob("*.json"), key=lambda p: p.stat().st_mtime, reverse=True)
    for path in files:
        try:
            result = load_results(path)
        except (ValueError, TypeError, KeyError) as exc:
            found.unreadable.append({"file": path.name, "reason": str(exc)})
            continue
        requests = [{k: getattr(r, k, None) for k in _REQUEST_KEYS} for r in result.requests[:MAX_REQUESTS_PER_RUN]]
        found.runs.append({"name": path.stem, "file": path.name, "metadata": result.metadata,
                           "summary": result.summary, "requests": requests,
                           "truncated": len(result.requests) > MAX_REQUESTS_PER_RUN})
    return found
