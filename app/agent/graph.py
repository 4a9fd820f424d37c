"""The agent graph: model -> tools loop with a step budget and an approval interrupt.

    START -> model --(answer)------------------------------> END
               |---(tool calls, budget left)--> tools ----> model
               |---(a proposed action)-------> approval --> tools
               '---(tool calls, budget spent)-> budget_exhausted -> END

A small model rambles; the loop does not break when it does (issue 59, item 4):

- a reply that ends inside a tool call (``finish_reason`` "length" after a call began, or
  arbor-server's ``truncated_tool_call`` mark) is never run and never enters the history: the
  step runs once more with more of the context's room (up to RETRY_GROWTH times the cut try's
  ``max_tokens``); cut again, or with no room for more, the turn ends with the model's text
  and a note saying what was cut and why nothing ran (outcome ``tool_call_cut``);
- a step that required a tool call (``tool_choice`` "required" or a named function: the forced
  first step) and got an answer without one ends the turn saying so (outcome ``no_tool_call``);
- a step whose tools ran but whose next model call cannot fit the context even with the history
  compacted and the results cut ends the turn saying what ran and why the model cannot go on
  (outcome ``context_full``), never a failed turn;
- a call whose arguments are no JSON object (not cut) is answered with its error and sent back
  with ``{}`` as its arguments (app/agent/messages.py), which every server accepts;
- the tools node fits one step's results together to the context that remains
  (app/agent/result_fit.py), so a step whose tools answered at length never fails the next call.

Nodes return partial state updates; routing lives in app/agent/routers.py. Each model call
is fitted to the server's context first (app/agent/context_budget.py), from the branch's
compaction level in the state (`context_fit`, which the call may only move forward); a
compacted history is recorded as a "compacted" span. Events for the client (token, compacted, model_call,
tool_call, tool_result) go out through LangGraph's custom stream
(`runtime.stream_writer`); an approval is a LangGraph `interrupt` whose payload names the
tool call, resumed with ``Command(resume={"approved": bool, "comment": str})``.

The approval node only asks; it runs nothing, because LangGraph re-executes an interrupted
node from its start when resumed. Tools run afterwards, once, in the tools node.

The state's messages are langchain-core messages (`add_messages`). The model is an
`ArborChatModel` (app/agent/chat_model.py); the body of each step is built, fitted and
recorded in OpenAI format (app/agent/messages.py converts at that boundary), and the chat
model sends exactly that body. The tools node runs LangGraph's `ToolNode`
(app/agent/tool_calls.py) and answers unparsable calls itself.

Cache hints: each model request says ``active``; the approval and tools nodes tell the server
the branch waits on tools (``tool_wait``), however long the operator takes; the turn's end is
told by app/services/turns.py.
"""

from __future__ import annotations

import time
from datetime import datetime

from langchain_core.messages import AIMessage, ToolMessage
from langchain_core.runnables import RunnableConfig
from langchain_core.runnables.config import merge_configs
from langgraph.graph import END, START, StateGraph
from langgraph.runtime import Runtime
from langgraph.types import StreamWriter, interrupt

from app.agent.cache_hints import APPROVAL_WAIT
from app.agent.chat_model import call_result
from app.agent.context import TurnContext
from app.agent.context_budget import FittedRequest
from app.agent.context_state import ContextState
from app.agent.messages import from_openai, openai_tool_calls, to_openai
from app.agent.model_client import ModelBackendError, ModelCallResult
from app.agent.requests import fitted_step_body, scenario_tools
from app.agent.result_fit import fit_step_results, refit_last_results
from app.agent.routers import route_after_model, tool_choice_for_step
from app.agent.state import AgentState, last_model_message
from app.agent.token_events import TokenEvents
from app.agent.tool_calls import TOOL_NODE, approval_needed, refuse_invalid_call
from app.agent.tool_schemas import schema_sizes
from app.db.models import utcnow


async def call_model(state: AgentState, config: RunnableConfig, runtime: Runtime[TurnContext]) -> dict:
    ctx = runtime.context
    write = runtime.stream_writer
    step = state.get("steps", 0) + 1
    model = await ctx.adapter.model_name()
    conversation = to_openai(state["messages"])
    context = ContextState.of(state.get("context_fit"))  # the branch's level and estimate
    budgets: list[int] = []  # max_tokens of each try whose tool call was cut
    refitted: list[ToolMessage] = []  # the last step's results, cut again to fit (they replace theirs)
    while True:
        try:
            message, body, fitted, started_at = await _model_step(
                ctx, config, write, model, conversation, context, state, step, _retry_budget(budgets, None),
                refitted)
        except ModelBackendError as exc:
            if exc.kind != "context_exceeded" or not _tools_ran(state, ctx.history_len):
                raise
            return _full_turn(state, ctx.history_len, refitted, context, str(exc))
        conversation = to_openai(_replaced(state["messages"], refitted))
        result = call_result(message)
        context = ctx.budget.observe(body, result.prompt_tokens, fitted.context)
        span_id = await ctx.recorder.model_call(step=step, body=body, started_at=started_at,
                                                duration_ms=result.duration_ms, result=result,
                                                tool_schemas=_tool_sizes(ctx, body))
        timings = result.timings or {}  # llama-server's: draft_n, draft_n_accepted when the server drafts
        write({"type": "model_call", "step": step, "span_id": span_id, "prompt_tokens": result.prompt_tokens,
               "completion_tokens": result.completion_tokens, "cached_tokens": result.cached_tokens,
               "cache_source": (result.cache or {}).get("source"), "ttft_ms": result.ttft_ms,
               "draft_n": timings.get("draft_n"), "draft_n_accepted": timings.get("draft_n_accepted"),
               "duration_ms": result.duration_ms, "finish_reason": result.finish_reason})
        if not _cut(result):
            break
        # A call cut by max_tokens is never run nor sent back: the step runs again with more of
        # the context's room, once; cut again (or no room for more), the turn ends saying so.
        budgets.append(int(body["max_tokens"]))
        larger = _retry_budget(budgets, fitted.room)
        if larger is None:
            ended = _cut_turn(result, budgets, step, context)
            ended["messages"] = [*refitted, *ended["messages"]]
            return ended
        write({"type": "retry", "step": step, "reason": "tool_call_cut", "cut_at_tokens": budgets[-1],
               "max_tokens": larger, "span_id": span_id})
    update: dict = {"messages": [*refitted, message], "steps": step, "awaiting": [], "context_fit": context.as_state()}
    for call in result.tool_calls:
        write({"type": "tool_call", "tool_call_id": call["id"], "name": call["function"]["name"],
               "arguments": call["function"]["arguments"], "step": step})
    if result.tool_calls:
        update["awaiting"] = [c["id"] for c in message.tool_calls if approval_needed(ctx, c)]
        return update
    answer = result.content
    if _forced(tool_choice_for_step(step, state["max_steps"], ctx.force_tool, ctx.tool_choice)):
        # the step required a tool call and the model answered without one: say so, never silently
        note = NO_TOOL_NOTE
        answer = f"{answer.strip()}\n\n{note}" if answer.strip() else note
        update["messages"] = [*refitted, AIMessage(content=answer, id=message.id,
                                                   response_metadata=message.response_metadata,
                                                   additional_kwargs=message.additional_kwargs)]
        update.update(final_answer=answer, outcome="no_tool_call")
        return update
    update["final_answer"] = answer
    update["outcome"] = "answered"
    return update


NO_TOOL_NOTE = ("[The workbench required a tool call in this step (tool_choice) and the model answered "
                "without one, so no tool ran.]")
RETRY_GROWTH = 4  # a retried step may take up to this many times the tokens of the cut try


async def _model_step(ctx: TurnContext, config: RunnableConfig, write: StreamWriter, model: str,
                      conversation: list[dict], context: ContextState, state: AgentState, step: int,
                      max_tokens: int | None,
                      refitted: list[ToolMessage]) -> tuple[AIMessage, dict, FittedRequest, datetime]:
    """One model call of step `step`, fitted to the context (compacted harder and sent once more
    when the server counts more than the estimate); `max_tokens` overrides the fitted budget
    (a retry of a cut call), within the room the context has. When even the compacted request
    leaves no room because the last step's results are long (their fit trusted an estimate that
    fell short), they are cut again, once (app/agent/result_fit.py): the replacements go to
    `refitted`, for the state."""
    refit = True
    server_refused = False
    for attempt in range(1, 4):
        try:
            body, fitted = await fitted_step_body(
                ctx.budget, ctx.adapter, ctx.scenario, model, conversation, ctx.history_len, context, step=step,
                max_steps=state["max_steps"], force_tool=ctx.force_tool, tool_choice=ctx.tool_choice,
                cache_session=ctx.cache_session, compact_tools=ctx.compact_tool_schemas)
        except ModelBackendError as exc:
            if not (exc.kind == "context_exceeded" and refit):  # the fit's own refusal
                raise
            refit = False
            choice = tool_choice_for_step(step, state["max_steps"], ctx.force_tool, ctx.tool_choice)
            replaced = await refit_last_results(ctx, dict(state), context, choice, write)
            if not replaced:
                raise
            refitted += replaced
            conversation = to_openai(_replaced(state["messages"], replaced))
            continue
        if max_tokens is not None:
            room = fitted.room
            body["max_tokens"] = max_tokens if room is None else max(1, min(max_tokens, room))
        if fitted.compacted:
            span_id = await ctx.recorder.compaction(step=step, fitted=fitted, retry=attempt > 1)
            done = fitted.compaction
            assert done is not None  # compacted
            write({"type": "compacted", "step": step, "span_id": span_id,
                   "tokens_before": done.tokens_before, "tokens_after": done.tokens_after,
                   "reduced_turns": done.reduced_turns, "dropped_turns": done.dropped_turns,
                   "stepped": done.stepped, "exact": fitted.exact})
        started_at, t0 = utcnow(), time.perf_counter()
        try:
            # The chat model sends this body as it is (built once, here; the messages are what
            # its callbacks see): the trace records what was sent (tests/app/test_traces_manifest.py).
            message = await ctx.chat_model.ainvoke(
                from_openai(body["messages"]), merge_configs(config, {"callbacks": [TokenEvents(write)]}), body=body)
        except ModelBackendError as exc:
            await ctx.recorder.model_call(step=step, body=body, started_at=started_at,
                                          duration_ms=(time.perf_counter() - t0) * 1000, error=str(exc),
                                          error_type=exc.kind, tool_schemas=_tool_sizes(ctx, body))
            # Our estimate fell short of the server's count: compact harder, once.
            if server_refused or not exc.context_exceeded or fitted.limit is None:
                raise
            server_refused = True
            context = ctx.budget.tighten(body, str(exc), fitted.context)
            continue
        assert isinstance(message, AIMessage)  # ArborChatModel answers one
        return message, body, fitted, started_at
    raise ModelBackendError("the request does not fit the model's context", "context_exceeded")


def _tool_sizes(ctx: TurnContext, body: dict) -> dict | None:
    """The size of the tools `body` sends beside their full schemas' (the model span records both)."""
    sent = body.get("tools")
    if not sent:
        return None
    return schema_sizes(scenario_tools(ctx.scenario, compact=False), sent, ctx.compact_tool_schemas)


def _replaced(messages: list, replacements: list[ToolMessage]) -> list:
    by_id = {m.id: m for m in replacements}
    return [by_id.get(m.id, m) for m in messages]


def _cut(result: ModelCallResult) -> bool:
    """The reply ended inside a tool call: cut by max_tokens after a call began (or before
    anything else came: the server holds a call's markup back until its name is complete), or
    marked cut by the server."""
    return result.cut_tool_calls or (result.finish_reason == "length" and not result.content.strip())


def _retry_budget(budgets: list[int], room: int | None) -> int | None:
    """max_tokens of the next try of a step whose calls were cut at `budgets`: none before the
    first cut; more than the cut try (up to RETRY_GROWTH times) within the context's `room`; None
    when it was retried already or there is no room for more."""
    if not budgets:
        return None
    if len(budgets) > 1:
        return None
    larger = budgets[-1] * RETRY_GROWTH if room is None else min(room, budgets[-1] * RETRY_GROWTH)
    return larger if larger > budgets[-1] else None


def _cut_turn(result: ModelCallResult, budgets: list[int], step: int, context: ContextState) -> dict:
    """End the turn after a step whose tool call was cut again: the model's text and why nothing ran."""
    names = ", ".join(dict.fromkeys(c["function"]["name"] for c in result.tool_calls if c["function"]["name"]))
    tries = " and ".join(str(b) for b in budgets)
    what = f"its call of {names}" if names else "its tool call"
    note = (f"[Stopped: the model's reply was cut off at {tries} tokens (max_tokens) before {what} was complete, "
            "so nothing was run. Ask for something shorter, or raise LLM_MAX_TOKENS.]")
    answer = f"{result.content.strip()}\n\n{note}" if result.content.strip() else note
    return {"messages": [AIMessage(content=answer)], "steps": step, "awaiting": [],
            "context_fit": context.as_state(), "final_answer": answer, "outcome": "tool_call_cut"}


def _tools_ran(state: AgentState, history_len: int) -> bool:
    """This turn's tools answered already (its messages past the history hold a tool result)."""
    return any(isinstance(m, ToolMessage) for m in state["messages"][history_len:])


def _full_turn(state: AgentState, history_len: int, refitted: list[ToolMessage], context: ContextState,
               reason: str) -> dict:
    """End the turn when the next model step cannot fit the context after this turn's tools ran,
    even with the history compacted and the results cut (a small context whose system prompt and
    tools take most of it, and calls whose own arguments are long): what ran and why the model
    cannot go on, as the turn's answer, not a failed turn. The results stay in the trace, the
    long ones whole as artifacts."""
    ran = [m.name for m in state["messages"][history_len:] if isinstance(m, ToolMessage) and m.name]
    names = ", ".join(dict.fromkeys(ran))
    answer = (f"[Stopped after the tools ran ({names}): the model has no room left to answer with their results. "
              f"{reason[:1].upper()}{reason[1:]}. The results are in this turn's trace; a narrower request, or "
              "fewer tools at once, fits.]")
    return {"messages": [*refitted, AIMessage(content=answer)], "steps": state.get("steps", 0), "awaiting": [],
            "context_fit": context.as_state(), "final_answer": answer, "outcome": "context_full"}


def _forced(choice: object) -> bool:
    return choice == "required" or isinstance(choice, dict)


async def request_approvals(state: AgentState, runtime: Runtime[TurnContext]) -> dict:
    """Ask the operator about each proposed action of the last model message, in order."""
    await runtime.context.hints.tool_wait(runtime.context.cache_session, [APPROVAL_WAIT])  # a person's time
    decided = state.get("decisions") or {}
    calls = {c["id"]: c for c in last_model_message(state).tool_calls}
    decisions: dict[str, dict] = {}
    for call_id in state["awaiting"]:
        if call_id in decided:
            continue
        call = calls[call_id]
        answer = interrupt({"tool_call_id": call_id, "tool_name": call["name"], "arguments": call["args"]})
        answer = answer if isinstance(answer, dict) else {"approved": bool(answer)}
        decisions[call_id] = {"approved": bool(answer.get("approved")), "comment": str(answer.get("comment") or "")}
    return {"decisions": decisions}


async def run_tools(state: AgentState, config: RunnableConfig, runtime: Runtime[TurnContext]) -> dict:
    """ToolNode runs the parsed calls (in parallel); the unparsable ones get their error here.
    The answers go into the history in the order of the calls."""
    ctx = runtime.context
    last = last_model_message(state)
    await ctx.hints.tool_wait(ctx.cache_session, [call["name"] for call in last.tool_calls])
    answers: list[ToolMessage] = []
    if last.tool_calls:
        answers += (await TOOL_NODE.ainvoke(state, config))["messages"]
    for call in last.invalid_tool_calls:
        answers.append(await refuse_invalid_call(ctx, runtime.stream_writer, call))
    order = {call["id"]: i for i, call in enumerate(openai_tool_calls(last))}
    answers.sort(key=lambda m: order[m.tool_call_id])
    # together, the step's results must leave the next model call room to answer
    return {"messages": await fit_step_results(ctx, dict(state), answers, runtime.stream_writer), "awaiting": []}


def stop_at_budget(state: AgentState) -> dict:
    """Answer the unexecuted tool calls (keeps the history valid) and end the turn."""
    last = last_model_message(state)
    note = f"Not executed: the step budget of {state['max_steps']} model calls for this turn is spent."
    messages = [ToolMessage(note, tool_call_id=c["id"]) for c in openai_tool_calls(last)]
    answer = last.content or (
        f"Stopped: the step budget of {state['max_steps']} model calls ran out before a final answer.")
    return {"messages": messages, "final_answer": answer, "outcome": "budget_exhausted"}


def build_graph(checkpointer=None):
    """The compiled agent graph; pass a LangGraph checkpointer (needed for approvals)."""
    graph = StateGraph(AgentState, context_schema=TurnContext)
    # (state, config, runtime) nodes: LangGraph runs them, its add_node overloads lack that form
    graph.add_node("model", call_model)  # type: ignore[call-overload]
    graph.add_node("approval", request_approvals)
    graph.add_node("tools", run_tools)  # type: ignore[call-overload]
    graph.add_node("budget_exhausted", stop_at_budget)
    graph.add_edge(START, "model")
    graph.add_conditional_edges("model", route_after_model, ["tools", "approval", "budget_exhausted", END])
    graph.add_edge("approval", "tools")
    graph.add_edge("tools", "model")
    graph.add_edge("budget_exhausted", END)
    return graph.compile(checkpointer=checkpointer)
