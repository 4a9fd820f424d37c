"""The lifecycle model's priors file: offline transition counts and dwell times (N^off).

Built from recorded runs by `python -m bench.lifecycle_priors` (a manifest, with the results of
its replay when there is one: `arbor replay` output), loaded by the server at start
(`--cache-priors PATH`); the server works without one (the counts are then online only).

    {"format": "arbor-lifecycle-priors/1", "states": [...], "bins": {"min_s": .., "ratio": .., "n": ..},
     "transitions": {"tool_wait": {"model_call": 120, "done": 3}, ...},
     "dwell_return": {"tool_wait": [counts per bin], ...}, "dwell_other": {...},
     "sources": ["...manifest...", ...], "sessions": 48, "requests": 96}

A file of another format or bin layout is refused with the reason (the server then refuses to
start: a priors file named on the command line that cannot be read is a mistake to report).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from server.cache.lifecycle_counts import BIN_MIN_S, BIN_RATIO, N_BINS, STATES, Counts

FORMAT = "arbor-lifecycle-priors/1"


class PriorsError(ValueError):
    """A priors file that cannot be used; the message names the file and the reason."""


def priors_dict(counts: Counts, **meta: Any) -> dict[str, Any]:
    return {"format": FORMAT, "states": list(STATES),
            "bins": {"min_s": BIN_MIN_S, "ratio": BIN_RATIO, "n": N_BINS},
            **counts.to_dict(), **meta}


def save_priors(counts: Counts, path: str | Path, **meta: Any) -> None:
    Path(path).write_text(json.dumps(priors_dict(counts, **meta), indent=1) + "\n", encoding="utf-8")


def parse_priors(data: Any, source: str = "<priors>") -> Counts:
    if not isinstance(data, dict) or data.get("format") != FORMAT:
        raise PriorsError(f"{source}: not a lifecycle priors file (format {FORMAT!r} expected)")
    bins = data.get("bins") or {}
    if (bins.get("min_s"), bins.get("ratio"), bins.get("n")) != (BIN_MIN_S, BIN_RATIO, N_BINS):
        raise PriorsError(f"{source}: dwell bins {bins} differ from this server's "
                          f"(min_s {BIN_MIN_S}, ratio {BIN_RATIO}, n {N_BINS}): build the file again")
    try:
        return Counts.from_dict(data)
    except (ValueError, TypeError, AttributeError) as exc:
        raise PriorsError(f"{source}: {exc}") from None


def load_priors(path: str | Path) -> Counts:
    path = Path(path)
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, json.JSONDecodeError) as exc:
        raise PriorsError(f"{path}: {exc}") from None
    return parse_priors(data, str(path))
