"""The graph state: OpenAI message dicts plus loop bookkeeping, with reducers."""

from __future__ import annotations

import operator
from typing import Annotated, TypedDict


def merge_decisions(left: dict | None, right: dict | None) -> dict:
    """Reducer: operator decisions accumulate by tool-call id."""
    return {**(left or {}), **(right or {})}


class AgentState(TypedDict, total=False):
    # The conversation without the system prompt (the model node prepends it), as OpenAI
    # message dicts, so the request body is exactly what the trace and manifest record.
    messages: Annotated[list[dict], operator.add]
    steps: int  # model calls made in this turn
    max_steps: int  # the step budget of this turn
    awaiting: list[str]  # tool-call ids of the last model message that need the operator
    decisions: Annotated[dict[str, dict], merge_decisions]  # tool-call id -> {"approved", "comment"}
    final_answer: str | None
    outcome: str | None  # answered | budget_exhausted
