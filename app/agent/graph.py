"""The agent graph: model -> tools loop with a step budget and an approval interrupt.

    START -> model --(answer)------------------------------> END
               |---(tool calls, budget left)--> tools ----> model
               |---(a proposed action)-------> approval --> tools
               '---(tool calls, budget spent)-> budget_exhausted -> END

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

from langchain_core.messages import ToolMessage
from langchain_core.runnables import RunnableConfig
from langchain_core.runnables.config import merge_configs
from langgraph.graph import END, START, StateGraph
from langgraph.runtime import Runtime
from langgraph.types import interrupt

from app.agent.chat_model import call_result
from app.agent.context import TurnContext
from app.agent.context_state import ContextState
from app.agent.messages import from_openai, openai_tool_calls, to_openai
from app.agent.model_client import ModelBackendError
from app.agent.requests import fitted_step_body
from app.agent.routers import route_after_model
from app.agent.state import AgentState, last_model_message
from app.agent.token_events import TokenEvents
from app.agent.tool_calls import TOOL_NODE, approval_needed, refuse_invalid_call
from app.db.models import utcnow


async def call_model(state: AgentState, config: RunnableConfig, runtime: Runtime[TurnContext]) -> dict:
    ctx = runtime.context
    write = runtime.stream_writer
    step = state.get("steps", 0) + 1
    model = await ctx.adapter.model_name()
    conversation = to_openai(state["messages"])
    context = ContextState.of(state.get("context_fit"))  # the branch's level and estimate
    for attempt in (1, 2):
        body, fitted = await fitted_step_body(
            ctx.budget, ctx.adapter, ctx.scenario, model, conversation, ctx.history_len, context, step=step,
            max_steps=state["max_steps"], force_tool=ctx.force_tool, tool_choice=ctx.tool_choice,
            cache_session=ctx.cache_session)
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
            break
        except ModelBackendError as exc:
            await ctx.recorder.model_call(step=step, body=body, started_at=started_at,
                                    duration_ms=(time.perf_counter() - t0) * 1000, error=str(exc), error_type=exc.kind)
            # Our estimate fell short of the server's count: compact harder, once.
            if attempt == 2 or not exc.context_exceeded or fitted.limit is None:
                raise
            context = ctx.budget.tighten(body, str(exc), fitted.context)
    result = call_result(message)
    context = ctx.budget.observe(body, result.prompt_tokens, fitted.context)
    span_id = await ctx.recorder.model_call(step=step, body=body, started_at=started_at,
                                      duration_ms=result.duration_ms, result=result)
    timings = result.timings or {}  # llama-server's: draft_n, draft_n_accepted when the server drafts
    write({"type": "model_call", "step": step, "span_id": span_id, "prompt_tokens": result.prompt_tokens,
           "completion_tokens": result.completion_tokens, "cached_tokens": result.cached_tokens,
           "cache_source": (result.cache or {}).get("source"), "ttft_ms": result.ttft_ms,
           "draft_n": timings.get("draft_n"), "draft_n_accepted": timings.get("draft_n_accepted"),
           "duration_ms": result.duration_ms, "finish_reason": result.finish_reason})
    update: dict = {"messages": [message], "steps": step, "awaiting": [], "context_fit": context.as_state()}
    for call in result.tool_calls:
        write({"type": "tool_call", "tool_call_id": call["id"], "name": call["function"]["name"],
               "arguments": call["function"]["arguments"], "step": step})
    if result.tool_calls:
        update["awaiting"] = [c["id"] for c in message.tool_calls if approval_needed(ctx, c)]
    else:
        update["final_answer"] = result.content
        update["outcome"] = "answered"
    return update


async def request_approvals(state: AgentState, runtime: Runtime[TurnContext]) -> dict:
    """Ask the operator about each proposed action of the last model message, in order."""
    await runtime.context.hints.tool_wait(runtime.context.cache_session)
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
    await ctx.hints.tool_wait(ctx.cache_session)
    last = last_model_message(state)
    answers: list[ToolMessage] = []
    if last.tool_calls:
        answers += (await TOOL_NODE.ainvoke(state, config))["messages"]
    for call in last.invalid_tool_calls:
        answers.append(await refuse_invalid_call(ctx, runtime.stream_writer, call))
    order = {call["id"]: i for i, call in enumerate(openai_tool_calls(last))}
    return {"messages": sorted(answers, key=lambda m: order[m.tool_call_id]), "awaiting": []}


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
