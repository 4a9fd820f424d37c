"""Tool-context compression (seed 003): large tool results enter the context trimmed.

A tool result is rendered as compact JSON. When it fits the budget it goes into the
conversation unchanged. Otherwise a compact representation is built that keeps the shape of
the data: whitespace is collapsed, duplicate list items dropped, long lists cut to the items
*most relevant to the turn's question* (BM25 over the question and the call's arguments, with
items that mention anomalies or errors kept first when nothing matches: app/agent/relevance.py),
in their original order, and long strings cut, tightening step by step until the text fits. A
note names how much was left out and the artifact that holds the full result, so nothing is
lost: the trace shows the original, and `TrimmedResult.cuts` says which items each cut list
kept and why (the tool span and the ``tool_result`` event carry it to the page).

The budget is in characters (the settings derive it from a character and an estimated
token budget, 4 characters per token). Deterministic: the same result, budget and query give
the same text byte for byte.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from typing import Any

from app.agent.relevance import Ranking, RelevanceQuery, rank

# (max list items, max string chars) tried in order until the result fits.
_STEPS = ((50, 2000), (20, 800), (10, 400), (6, 200), (3, 120), (2, 80), (1, 60))

_WS = re.compile(r"\s+")
MAX_REPORTED_LISTS = 20  # a trace names at most this many cut lists ...
MAX_REPORTED_INDICES = 50  # ... and at most this many kept indices of each


@dataclass(frozen=True)
class ListCut:
    """One list the trimming cut: where it is, how many distinct items it had, which it kept.

    `kept` are indices into the original list (first occurrences of duplicates), in order, at
    most MAX_REPORTED_INDICES of them; the counts are exact. An item is kept as "relevant" (it
    matches the question), "flagged" (it mentions a fault) or "leading" (by position, when too
    few items match or are flagged)."""

    path: str  # JSONPath-like: $, $.rows, $.devices[3].events
    items: int
    kept: tuple[int, ...]
    kept_count: int
    relevant: int
    flagged: int
    leading: int
    dropped_relevant: int
    dropped_flagged: int

    def as_dict(self) -> dict:
        return {"path": self.path, "items": self.items, "kept": list(self.kept), "kept_count": self.kept_count,
                "relevant": self.relevant, "flagged": self.flagged, "leading": self.leading,
                "dropped_relevant": self.dropped_relevant, "dropped_flagged": self.dropped_flagged}


@dataclass(frozen=True)
class TrimmedResult:
    """What enters the context (`context_text`) and what is kept in full (`full_text`); when
    lists were cut, `cuts` (at most MAX_REPORTED_LISTS) and the query they were ranked against."""

    context_text: str
    full_text: str
    trimmed: bool
    cuts: tuple[ListCut, ...] = ()
    query: RelevanceQuery | None = None

    @property
    def full_chars(self) -> int:
        return len(self.full_text)

    def ranking_report(self) -> dict | None:
        """What the trace and the page show of the cut: the question, the query's words, totals
        over every cut list and the lists themselves; None when no list was cut."""
        if not self.cuts:
            return None
        total = {key: sum(getattr(c, key) for c in self.cuts)
                 for key in ("items", "kept_count", "relevant", "flagged", "leading", "dropped_relevant",
                             "dropped_flagged")}
        return {"question": self.query.describe() if self.query else "",
                "terms": list(self.query.terms[:40]) if self.query else [],
                "lists_cut": len(self.cuts), **total, "lists": [c.as_dict() for c in self.cuts]}


def render_result(result: Any) -> str:
    """A tool result as the model sees it: strings as they are, anything else as JSON."""
    if isinstance(result, str):
        return result
    return json.dumps(result, ensure_ascii=False, separators=(",", ":"), default=str)


def trim_tool_result(result: Any, budget_chars: int, artifact_id: str,
                     query: RelevanceQuery | None = None) -> TrimmedResult:
    """Fit `result` into `budget_chars`; `artifact_id` is named in the note when trimmed; lists
    that must be cut keep the items most relevant to `query` (None: flagged items, then the first)."""
    full = render_result(result)
    if len(full) <= budget_chars:
        return TrimmedResult(full, full, trimmed=False)
    note = f"\n[trimmed by the workbench: the full result has {len(full)} characters, kept as artifact {artifact_id}]"
    room = max(budget_chars - len(note), 16)
    compact, cuts = _Shaper(query).fit(result, room)
    return TrimmedResult(compact + note, full, trimmed=True, cuts=tuple(cuts[:MAX_REPORTED_LISTS]), query=query)


class _Shaper:
    """One trimming: tries the steps in order; each list is ranked once, whatever the step."""

    def __init__(self, query: RelevanceQuery | None) -> None:
        self.query = query
        # id(list) -> (distinct items, index of each in the list, their ranking); the lists are
        # parts of the result, alive for the whole trimming, so their ids stay theirs.
        self._ranked: dict[int, tuple[list, list[int], Ranking]] = {}
        self.cuts: list[ListCut] = []

    def fit(self, result: Any, room: int) -> tuple[str, list[ListCut]]:
        for max_items, max_str in _STEPS:
            self.cuts = []
            text = render_result(self._compact(result, max_items, max_str, "$"))
            if len(text) <= room:
                return text, self.cuts
        # Nothing structured fits (e.g. one enormous scalar): a plain cut is the honest fallback.
        self.cuts = []
        text = render_result(self._compact(result, 1, room, "$"))
        return (text[: room - 1] + "…" if len(text) > room else text), self.cuts

    def _compact(self, value: Any, max_items: int, max_str: int, path: str) -> Any:
        if isinstance(value, str):
            text = _WS.sub(" ", value).strip()
            if len(text) > max_str:
                return f"{text[:max_str]}…[+{len(text) - max_str} chars]"
            return text
        if isinstance(value, dict):
            return {key: self._compact(item, max_items, max_str, f"{path}.{key}") for key, item in value.items()}
        if isinstance(value, (list, tuple)):
            return self._compact_list(value, max_items, max_str, path)
        return value

    def _distinct(self, items: list | tuple) -> tuple[list, list[int], Ranking]:
        known = self._ranked.get(id(items))
        if known is None:
            unique, positions, texts, seen = [], [], [], set()
            for i, item in enumerate(items):
                key = render_result(item)
                if key not in seen:
                    seen.add(key)
                    unique.append(item)
                    positions.append(i)
                    texts.append(key)
            known = self._ranked[id(items)] = (unique, positions, rank(texts, self.query))
        return known

    def _compact_list(self, items: list | tuple, max_items: int, max_str: int, path: str) -> list:
        unique, positions, ranking = self._distinct(items)
        duplicates = len(items) - len(unique)
        kept = ranking.select(max_items) if len(unique) > max_items else list(range(len(unique)))
        if len(kept) < len(unique):
            self._record(path, positions, ranking, kept)
        out = [self._compact(unique[k], max_items, max_str, f"{path}[{positions[k]}]") for k in kept]
        omitted = len(unique) - len(kept)
        if omitted or duplicates:
            parts = [f"{omitted} more items omitted"] if omitted else []
            parts += [f"{duplicates} duplicates removed"] if duplicates else []
            out.append(f"… {', '.join(parts)}")
        return out

    def _record(self, path: str, positions: list[int], ranking: Ranking, kept: list[int]) -> None:
        reasons = [ranking.reason(k) for k in kept]
        chosen = set(kept)
        dropped = [ranking.reason(i) for i in range(len(positions)) if i not in chosen]
        self.cuts.append(ListCut(
            path=path, items=len(positions), kept=tuple(positions[k] for k in kept[:MAX_REPORTED_INDICES]),
            kept_count=len(kept), relevant=reasons.count("relevant"), flagged=reasons.count("flagged"),
            leading=reasons.count("leading"), dropped_relevant=dropped.count("relevant"),
            dropped_flagged=dropped.count("flagged")))
