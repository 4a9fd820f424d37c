"""The helpers the sections of docs/benchmarks.md's generator use: a results file read (None when it is
missing), a figure formatted (a dash for none) and a result file found where its results were moved."""

from __future__ import annotations

import json
from pathlib import Path


def _load(path: Path) -> dict | None:
    return json.loads(path.read_text()) if path.exists() else None


def _f(x, nd=2) -> str:
    return "–" if x is None else (f"{x:.{nd}f}" if isinstance(x, float) else str(x))


def result_path(index_dir: Path, recorded: str) -> Path:
    """A run's result file: where its index recorded it, or beside the index where the results were moved (a GPU
    host's results, unpacked into bench/results/device/)."""
    path = Path(recorded)
    return path if path.exists() else index_dir / path.parent.name / path.name
