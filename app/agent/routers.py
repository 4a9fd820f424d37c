"""Small pure functions that steer the graph."""

from __future__ import annotations

from typing import Any

from langgraph.graph import END

from app.agent.state import AgentState, last_model_message


def route_after_model(state: AgentState) -> str:
    """END on an answer; otherwise tools, the operator first, or stop at the step budget."""
    last = last_model_message(state)
    if not (last.tool_calls or last.invalid_tool_calls):
        return END
    if state["steps"] >= state["max_steps"]:
        return "budget_exhausted"
    decided = state.get("decisions") or {}
    if any(call_id not in decided for call_id in state.get("awaiting") or []):
        return "approval"
    return "tools"


def tool_choice_for_step(step: int, max_steps: int, force_tool: bool, tool_choice: Any) -> Any:
    """tool_choice of model step `step` (1-based); None means "auto" (left out of the body).

    An explicit choice or `force_tool` ("required") applies to the first step only: small
    models do not pick tools on their own, and later steps must be free to answer. The last
    step under the budget forbids tools ("none") so the turn ends with an answer.
    """
    if step == 1 and tool_choice is not None:
        return tool_choice
    if step == 1 and force_tool:
        return "required"
    if step >= max_steps:
        return "none"
    return None
