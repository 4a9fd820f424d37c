"""Tool-context compression (seed 003): large tool results enter the context trimmed.

A tool result is rendered as compact JSON. When it fits the budget it goes into the
conversation unchanged. Otherwise a compact representation is built that keeps the shape of
the data: whitespace is collapsed, duplicate list items dropped, long lists cut to their
first items *while keeping items that mention anomalies or errors*, and long strings cut,
tightening step by step until the text fits. A note names how much was left out and the
artifact that holds the full result, so nothing is lost: the trace shows the original.

The budget is in characters (the settings derive it from a character and an estimated
token budget, 4 characters per token).
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from typing import Any

# Items whose text mentions one of these are kept first when a list must be cut, so the
# evidence an agent usually needs (faults, errors, anomalies) survives compression.
_PRIORITY = re.compile(r"anomal|error|fault|fail|critical|warn|alert|incident|degraded|down", re.IGNORECASE)

# (max list items, max string chars) tried in order until the result fits.
_STEPS = ((50, 2000), (20, 800), (10, 400), (6, 200), (3, 120), (2, 80), (1, 60))

_WS = re.compile(r"\s+")


@dataclass(frozen=True)
class TrimmedResult:
    """What enters the context (`context_text`) and what is kept in full (`full_text`)."""

    context_text: str
    full_text: str
    trimmed: bool

    @property
    def full_chars(self) -> int:
        return len(self.full_text)


def render_result(result: Any) -> str:
    """A tool result as the model sees it: strings as they are, anything else as JSON."""
    if isinstance(result, str):
        return result
    return json.dumps(result, ensure_ascii=False, separators=(",", ":"), default=str)


def trim_tool_result(result: Any, budget_chars: int, artifact_id: str) -> TrimmedResult:
    """Fit `result` into `budget_chars`; `artifact_id` is named in the note when trimmed."""
    full = render_result(result)
    if len(full) <= budget_chars:
        return TrimmedResult(full, full, trimmed=False)
    note = f"\n[trimmed by the workbench: the full result has {len(full)} characters, kept as artifact {artifact_id}]"
    room = max(budget_chars - len(note), 16)
    compact = _fit(result, room)
    return TrimmedResult(compact + note, full, trimmed=True)


def _fit(result: Any, room: int) -> str:
    for max_items, max_str in _STEPS:
        text = render_result(_compact(result, max_items, max_str))
        if len(text) <= room:
            return text
    # Nothing structured fits (e.g. one enormous scalar): a plain cut is the honest fallback.
    text = render_result(_compact(result, 1, room))
    return text[: room - 1] + "…" if len(text) > room else text


def _compact(value: Any, max_items: int, max_str: int) -> Any:
    if isinstance(value, str):
        text = _WS.sub(" ", value).strip()
        if len(text) > max_str:
            return f"{text[:max_str]}…[+{len(text) - max_str} chars]"
        return text
    if isinstance(value, dict):
        return {key: _compact(item, max_items, max_str) for key, item in value.items()}
    if isinstance(value, (list, tuple)):
        return _compact_list(list(value), max_items, max_str)
    return value


def _compact_list(items: list, max_items: int, max_str: int) -> list:
    unique, seen = [], set()
    for item in items:
        key = render_result(item)
        if key not in seen:
            seen.add(key)
            unique.append(item)
    duplicates = len(items) - len(unique)
    kept = _select(unique, max_items)
    out = [_compact(item, max_items, max_str) for item in kept]
    omitted = len(unique) - len(kept)
    if omitted or duplicates:
        parts = [f"{omitted} more items omitted"] if omitted else []
        parts += [f"{duplicates} duplicates removed"] if duplicates else []
        out.append(f"… {', '.join(parts)}")
    return out


def _select(items: list, limit: int) -> list:
    """The first `limit` items, preferring ones that mention anomalies, in original order."""
    if len(items) <= limit:
        return items
    priority = [i for i, item in enumerate(items) if _PRIORITY.search(render_result(item))]
    chosen = set(priority[:limit])
    for i in range(len(items)):
        if len(chosen) >= limit:
            break
        chosen.add(i)
    return [items[i] for i in sorted(chosen)]
