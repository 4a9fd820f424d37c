"""The two helpers every section of docs/benchmarks.md's generator uses: a results file read (None when it is
missing) and a figure formatted (a dash for none)."""

from __future__ import annotations

import json
from pathlib import Path


def _load(path: Path) -> dict | None:
    return json.loads(path.read_text()) if path.exists() else None


def _f(x, nd=2) -> str:
    return "–" if x is None else (f"{x:.{nd}f}" if isinstance(x, float) else str(x))
