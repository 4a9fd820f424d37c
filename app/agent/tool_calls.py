"""Executing one tool call of the model: arguments, tool, approval, trimming, trace.

Every outcome becomes a tool message the model sees next, so the run continues after a
failure: a `ToolError` (bad arguments, unknown tool, service down) gives its readable
message; any other exception is recorded as an error with its type and reported the same
way. Proposed actions (`requires_approval`) are never executed on the model's word: the
operator's decision, taken before this runs (graph interrupt), becomes the result; a tool
marked `apply_on_approval` (appending a story chapter) runs only after an approval.
"""

from __future__ import annotations

import json
import logging
import time
from dataclasses import dataclass
from typing import Any

from app.agent.context import TurnContext
from app.agent.trimming import trim_tool_result
from app.db.models import new_id, utcnow
from tools.argument_validation import ArgumentProblems, validate_arguments
from tools.base import ToolError, run_tool

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class ToolCallOutcome:
    message: dict  # the "tool" message for the conversation
    event: dict  # the tool_result event for the client


def parse_arguments(raw: Any) -> dict:
    """The model's arguments as a dict; ToolError when they are not a JSON object."""
    if isinstance(raw, dict):
        return raw
    try:
        value = json.loads(raw or "{}")
    except json.JSONDecodeError as exc:
        raise ToolError(f"arguments are not valid JSON ({exc.msg} at position {exc.pos}): {str(raw)[:200]}") from None
    if not isinstance(value, dict):
        raise ToolError(f"arguments must be a JSON object, got {type(value).__name__}")
    return value


def approval_needed(ctx: TurnContext, call: dict) -> bool:
    """True when the call names a proposed action with valid arguments (ask the operator).

    Invalid proposals are not shown to the operator: the tools node returns their error.
    """
    try:
        tool = ctx.scenario.tool(call["function"]["name"])
        if not tool.requires_approval:
            return False
        validate_arguments(tool.parameters, parse_arguments(call["function"]["arguments"]))
    except (ToolError, ArgumentProblems):
        return False
    return True


async def _approval_result(ctx: TurnContext, tool: Any, arguments: dict, decision: dict | None) -> dict:
    try:
        validate_arguments(tool.parameters, arguments)
    except ArgumentProblems as problems:  # invalid proposals never reach the operator
        raise ToolError(f"invalid arguments for {tool.name}: {problems}") from None
    if decision is None:  # the graph asks before running tools; reaching here is a bug
        raise ToolError(f"{tool.name} is a proposed action and has no operator decision")
    # The tools contract: the app never calls a proposed action's func on the model's word.
    # The operator's decision, not the proposal's own formatting, is what the model must see.
    record = {"action_tool": tool.name, **arguments}
    verdict = "approved" if decision.get("approved") else "rejected"
    if verdict == "approved" and tool.apply_on_approval:
        applied = await run_tool(tool, ctx.tool_context, arguments)
        return {"proposal": record, "operator_decision": verdict, "applied": applied,
                "note": "The operator approved; the app applied it."}
    note = (f"The operator {verdict} this proposed action. The agent does not execute actions: "
            + ("the operator carries it out." if verdict == "approved" else "it will not be carried out."))
    result = {"proposal": record, "operator_decision": verdict, "executed_by_agent": False, "note": note}
    if decision.get("comment"):
        result["operator_comment"] = decision["comment"]
    return result


async def execute_tool_call(ctx: TurnContext, call: dict, decision: dict | None = None) -> ToolCallOutcome:
    name = call["function"]["name"]
    call_id = call["id"]
    started_at, t0 = utcnow(), time.perf_counter()
    arguments: Any = call["function"].get("arguments")
    result: Any = None
    error = error_type = None
    requires_approval = False
    try:
        arguments = parse_arguments(arguments)
        tool = ctx.scenario.tool(name)
        requires_approval = tool.requires_approval
        if requires_approval:
            result = await _approval_result(ctx, tool, arguments, decision)
        else:
            result = await run_tool(tool, ctx.tool_context, arguments)
    except ToolError as exc:
        error, error_type = str(exc), type(exc).__name__
    except Exception as exc:  # a tool bug must not end the run: record it, tell the model
        log.warning("tool %s raised", name, exc_info=True)
        error, error_type = f"{type(exc).__name__}: {exc}", type(exc).__name__
    duration_ms = (time.perf_counter() - t0) * 1000

    artifact_id = None
    trimmed = False
    full_chars = None
    if error is not None:
        content = f"Error from tool {name}: {error}"
    else:
        candidate_id = new_id()
        shaped = trim_tool_result(result, ctx.tool_budget_chars, candidate_id)
        content, trimmed, full_chars = shaped.context_text, shaped.trimmed, shaped.full_chars
        if trimmed:
            artifact_id = candidate_id
            await ctx.recorder.artifact(artifact_id=artifact_id, tool_name=name, call_id=call_id,
                                  content=shaped.full_text, context_chars=len(content))
    decision_name = None
    if requires_approval and decision is not None:
        decision_name = "approved" if decision.get("approved") else "rejected"
    span_id = await ctx.recorder.tool_call(
        name=name, call_id=call_id, arguments=arguments, started_at=started_at, duration_ms=duration_ms,
        context_text=content, error=error, error_type=error_type, trimmed=trimmed, full_chars=full_chars,
        artifact_id=artifact_id, requires_approval=requires_approval, decision=decision_name)
    event = {"type": "tool_result", "tool_call_id": call_id, "name": name, "content": content,
             "error": error, "trimmed": trimmed, "full_chars": full_chars, "artifact_id": artifact_id,
             "duration_ms": round(duration_ms, 3), "span_id": span_id}
    message = {"role": "tool", "tool_call_id": call_id, "content": content}
    return ToolCallOutcome(message=message, event=event)
