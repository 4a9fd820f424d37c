"""Executing the model's tool calls: LangGraph's `ToolNode`, wrapped by the workbench.

`TOOL_NODE` runs the calls of the last AI message, in parallel. It is built with no tools:
each turn's tools are its scenario's (app/agent/scenario_tools.py), which `run_tool_call`
(the node's `awrap_tool_call`) looks up and hands to ToolNode's `execute` per call. Around
that execution the wrapper keeps the workbench's contract:

- every outcome becomes a ToolMessage the model sees next, so the run continues after a
  failure: a `ToolError` (bad arguments, unknown tool, service down) gives its readable
  message; any other exception is recorded as an error with its type and reported the same
  way (the node is built with ``handle_tool_errors=False`` so all of them reach the wrapper);
- proposed actions (`requires_approval`) are never executed on the model's word: the
  operator's decision, taken before this runs (graph interrupt) and found in the state's
  ``decisions``, becomes the result, and a rejected call is answered without running
  anything; a tool marked `apply_on_approval` (appending a story chapter) runs only after an
  approval;
- results are trimmed to the context budget (the full text kept as an artifact), a long list
  keeping the items most relevant to the turn's question and the call's arguments
  (app/agent/relevance.py; the question is the state's last user message), recorded as a span,
  and sent to the client as a ``tool_result`` event, both saying what the cut kept
  (``ranking``); the step's results together are then fitted to the context that remains
  (app/agent/result_fit.py).

Calls whose arguments are not a JSON object are ``invalid_tool_calls`` of the AI message;
ToolNode does not see them, `refuse_invalid_call` answers them with the same error the
model would have got before.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Awaitable, Callable
from datetime import datetime
from typing import Any, cast

from langchain_core.messages import ToolMessage
from langchain_core.messages.tool import InvalidToolCall, ToolCall
from langgraph.prebuilt import ToolNode
from langgraph.prebuilt.tool_node import ToolCallRequest

from app.agent.context import TurnContext
from app.agent.relevance import RelevanceQuery
from app.agent.result_fit import StepResult
from app.agent.scenario_tools import langchain_tool, requires_approval
from app.agent.state import turn_question
from app.agent.trimming import trim_tool_result
from app.db.models import new_id, utcnow
from tools.argument_validation import ArgumentProblems, validate_arguments
from tools.base import Tool, ToolError

log = logging.getLogger(__name__)

Execute = Callable[[ToolCallRequest], Awaitable[Any]]


def approval_needed(ctx: TurnContext, call: ToolCall) -> bool:
    """True when the call names a proposed action with valid arguments (ask the operator).

    Invalid proposals are not shown to the operator: the tools node returns their error.
    """
    try:
        tool = ctx.scenario.tool(call["name"])
        if not requires_approval(tool):
            return False
        validate_arguments(tool.parameters, call["args"])
    except (ToolError, ArgumentProblems):
        return False
    return True


async def run_tool_call(request: ToolCallRequest, execute: Execute) -> ToolMessage:
    """ToolNode's wrapper around one call: approval, execution, trimming, trace, event."""
    ctx = cast(TurnContext, request.runtime.context)  # the graph's context_schema
    call = request.tool_call
    decision = (request.state.get("decisions") or {}).get(call["id"])
    started_at, t0 = utcnow(), time.perf_counter()
    result: Any = None
    error = error_type = None
    proposal = False
    try:
        tool = ctx.scenario.tool(call["name"])
        proposal = requires_approval(tool)

        async def run() -> Any:
            return await _execute(request, execute, tool, ctx)

        result = await (_approval_result(tool, call["args"], decision, run) if proposal else run())
    except ToolError as exc:
        error, error_type = str(exc), type(exc).__name__
    except Exception as exc:  # a tool bug must not end the run: record it, tell the model
        log.warning("tool %s raised", call["name"], exc_info=True)
        error, error_type = f"{type(exc).__name__}: {exc}", type(exc).__name__
    decision_name = None
    if proposal and decision is not None:
        decision_name = "approved" if decision.get("approved") else "rejected"
    # What a long result is ranked against when it must be cut: the turn's question, from the
    # graph's state (ToolNode hands the node's state to each call), and this call's arguments.
    query = RelevanceQuery(turn_question(_messages(request.state)), call["args"])
    return await _answer(ctx, request.runtime.stream_writer, call["name"], call["id"] or "", call["args"], started_at,
                         (time.perf_counter() - t0) * 1000, result, error, error_type, proposal, decision_name,
                         query)


def _messages(state: Any) -> list:
    """The messages of the state ToolNode was given (the graph's dict; a list or a model elsewhere)."""
    if isinstance(state, dict):
        return list(state.get("messages") or [])
    if isinstance(state, list):
        return state
    return list(getattr(state, "messages", None) or [])


async def refuse_invalid_call(ctx: TurnContext, write: Callable[[dict], None], call: InvalidToolCall) -> ToolMessage:
    """The answer to a call whose arguments could not be parsed (its error names why)."""
    return await _answer(ctx, write, call["name"] or "", call["id"] or "", call["args"], utcnow(), 0.0, None,
                         call["error"] or "arguments are not a JSON object", ToolError.__name__, False, None)


# handle_tool_errors=False: every exception reaches `run_tool_call`, which reports it itself.
TOOL_NODE = ToolNode([], awrap_tool_call=run_tool_call, handle_tool_errors=False)


async def _execute(request: ToolCallRequest, execute: Execute, tool: Any, ctx: TurnContext) -> Any:
    """Run the scenario's tool through ToolNode; the raw result for a `Tool`, the content otherwise."""
    message = await execute(request.override(tool=langchain_tool(tool, ctx.tool_context)))
    if not isinstance(message, ToolMessage):
        raise ToolError(f"tool {tool.name} returned {type(message).__name__}; the workbench takes tool messages")
    if message.status == "error":
        raise ToolError(str(message.content))
    # A `Tool` answers content_and_artifact: the artifact is its result before it became text,
    # which trimming needs to keep its shape.
    return message.artifact if isinstance(tool, Tool) else message.content


async def _approval_result(tool: Any, arguments: dict, decision: dict | None,
                           run: Callable[[], Awaitable[Any]]) -> dict:
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
        return {"proposal": record, "operator_decision": verdict, "applied": await run(),
                "note": "The operator approved; the app applied it."}
    note = (f"The operator {verdict} this proposed action. The agent does not execute actions: "
            + ("the operator carries it out." if verdict == "approved" else "it will not be carried out."))
    result = {"proposal": record, "operator_decision": verdict, "executed_by_agent": False, "note": note}
    if decision.get("comment"):
        result["operator_comment"] = decision["comment"]
    return result


async def _answer(ctx: TurnContext, write: Callable[[dict], None], name: str, call_id: str, arguments: Any,
                  started_at: datetime, duration_ms: float, result: Any, error: str | None, error_type: str | None,
                  requires_approval: bool, decision: str | None, query: RelevanceQuery | None = None) -> ToolMessage:
    """Shape the outcome for the context, record its span (and artifact), send the event."""
    artifact_id = None
    trimmed = False
    full_chars = None
    ranking = None
    if error is not None:
        content = f"Error from tool {name}: {error}"
    else:
        candidate_id = new_id()
        shaped = trim_tool_result(result, ctx.tool_budget_chars, candidate_id, query)
        content, trimmed, full_chars = shaped.context_text, shaped.trimmed, shaped.full_chars
        ranking = shaped.ranking_report()
        if trimmed:
            artifact_id = candidate_id
            await ctx.recorder.artifact(artifact_id=artifact_id, tool_name=name, call_id=call_id,
                                        content=shaped.full_text, context_chars=len(content))
    span_id = await ctx.recorder.tool_call(
        name=name, call_id=call_id, arguments=arguments, started_at=started_at, duration_ms=duration_ms,
        context_text=content, error=error, error_type=error_type, trimmed=trimmed, full_chars=full_chars,
        artifact_id=artifact_id, requires_approval=requires_approval, decision=decision, ranking=ranking)
    write({"type": "tool_result", "tool_call_id": call_id, "name": name, "content": content,
           "error": error, "trimmed": trimmed, "full_chars": full_chars, "artifact_id": artifact_id,
           "duration_ms": round(duration_ms, 3), "span_id": span_id, "ranking": ranking})
    # The full result is kept as an artifact row when trimmed; the state keeps only what the
    # model sees, so checkpoints do not carry every large result twice. Until the step's results
    # are fitted together (app/agent/result_fit.py, which then clears it) the raw result rides along.
    step_result = None if error is not None else StepResult(
        raw=result, full_text=shaped.full_text, artifact_id=artifact_id, name=name, call_id=call_id,
        duration_ms=duration_ms, span_id=span_id, query=query, ranking=ranking)
    return ToolMessage(content=content, tool_call_id=call_id, name=name,
                       status="error" if error is not None else "success", artifact=step_result)
