"""One step's tool results, fitted to the context that remains (issue 59, item 4).

Each result is trimmed on its own to ``ARBOR_TOOL_RESULT_MAX_CHARS`` / ``_MAX_TOKENS``
(app/agent/trimming.py). A step that calls several tools at once can still bring back more
than the context holds after the prompt: the story writer's first step, five tools beside a
system prompt of 6,600 tokens in a context of 8,192. Compaction never touches the current turn,
so the next model call would fail ("the request needs about 10,509 tokens even with the
history compacted") because the turn's own tools answered at length.

So the tools node measures the request the next model step will send (the server's token
count where it gives one, the history compacted as that step will compact it:
`ContextBudget.measure`) and, when it leaves less than a full answer's room
(`ContextBudget.reserve`), cuts this step's results further: the largest first, down to a
common cap that fits (water filling), each by the same trimming (the shape of the data kept,
a long list keeping the items most relevant to the turn's question, anomalies first when none
match: app/agent/relevance.py) with the note naming the artifact that keeps the full text, which
the model can read a page at a time (`read_artifact`, where the scenario offers it). Each result
cut here is sent to the client again as a `tool_result` event with ``"fitted": true`` and its
``ranking``, and its tool span is updated to what the model now sees. A few rounds
at most (the token count of a cut result is measured, not assumed); a request that cannot
fit even so is left to the model call, which reports it.

The tools node hands over each result's raw value in the ToolMessage's ``artifact`` (a
`StepResult`); it is cleared here before the messages enter the state, which keeps only what
the model sees.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from langchain_core.messages import AIMessage, ToolMessage

from app.agent.context import TurnContext
from app.agent.context_state import ContextState
from app.agent.messages import to_openai
from app.agent.relevance import RelevanceQuery
from app.agent.requests import scenario_tools, system_message
from app.agent.routers import tool_choice_for_step
from app.agent.state import turn_question
from app.agent.token_estimate import request_chars
from app.agent.trimming import trim_tool_result
from app.db.models import new_id

MIN_RESULT_CHARS = 300  # a result is never cut below this (its note alone takes a third of it)
ROUNDS = 4


@dataclass
class StepResult:
    """What the tools node knows of one result while it runs (ToolMessage.artifact)."""

    raw: Any  # the tool's value before it became text
    full_text: str
    artifact_id: str | None  # the artifact holding the full text, once there is one
    name: str
    call_id: str
    duration_ms: float
    span_id: str | None
    query: RelevanceQuery | None = None  # what a cut ranks a long list against (app/agent/relevance.py)
    ranking: dict | None = None  # what the last cut kept (TrimmedResult.ranking_report)


def water_cap(lengths: list[int], budget: int, floor: int = MIN_RESULT_CHARS) -> int:
    """The largest cap c >= `floor` with sum(min(length, c)) <= `budget` (`floor` when none fits):
    results shorter than the cap stay whole, the longer ones are all cut to it."""
    low, high = floor, max([floor, *lengths])
    if sum(min(n, high) for n in lengths) <= budget:
        return high
    while low < high:
        middle = (low + high + 1) // 2
        low, high = (middle, high) if sum(min(n, middle) for n in lengths) <= budget else (low, middle - 1)
    return low


async def fit_step_results(ctx: TurnContext, state: dict, answers: list[ToolMessage],
                           write: Callable[[dict], None]) -> list[ToolMessage]:
    """`answers` (this step's tool messages, in order) with the results cut so that the next
    model step's request leaves room for a full answer; their `StepResult`s cleared."""
    try:
        choice = tool_choice_for_step(state.get("steps", 0) + 1, state["max_steps"], ctx.force_tool, ctx.tool_choice)
        return await _fit(ctx, state["messages"], answers, ContextState.of(state.get("context_fit")), choice, write)
    finally:
        for answer in answers:
            answer.artifact = None


async def refit_last_results(ctx: TurnContext, state: dict, context: ContextState, choice: object,
                             write: Callable[[dict], None]) -> list[ToolMessage]:
    """After the server refused a model step as too long for its context, although the results
    were fitted by the estimate (a server that counts no tokens, an estimate learned too low): the
    results the last step brought (the tool messages ending the history, of this turn) cut again,
    from their text, against `context` (the estimate tightened by the refusal). The replacements
    (same ids: they replace the messages in the state) of those it cut; none when there was
    nothing to cut."""
    messages = list(state["messages"])
    start = len(messages)
    while start > ctx.history_len and isinstance(messages[start - 1], ToolMessage):
        start -= 1
    question = turn_question(messages)
    arguments = {c["id"]: c["args"] for m in messages[:start] if isinstance(m, AIMessage) for c in m.tool_calls}
    answers = [ToolMessage(content=_text(m), tool_call_id=m.tool_call_id, name=m.name, status=m.status, id=m.id,
                           artifact=_from_text(m, RelevanceQuery(question, arguments.get(m.tool_call_id))))
               for m in messages[start:] if isinstance(m, ToolMessage)]
    if not answers:
        return []
    before = [_text(a) for a in answers]
    try:
        fitted = await _fit(ctx, messages[:start], answers, context, choice, write)
    finally:
        for answer in answers:
            answer.artifact = None
    return [a for a, text in zip(fitted, before) if _text(a) != text]


def _from_text(message: ToolMessage, query: RelevanceQuery) -> StepResult | None:
    """What a result already in the history can be cut from: its text (an error is left alone);
    the artifact its note names keeps the full text, if it was trimmed before."""
    if message.status == "error":
        return None
    text = _text(message)
    named = _ARTIFACT_NOTE.search(text)
    return StepResult(raw=text.split(TRIM_NOTE, 1)[0], full_text=text, artifact_id=named.group(1) if named else None,
                      name=message.name or "", call_id=message.tool_call_id, duration_ms=0.0, span_id=None,
                      query=query)


_ARTIFACT_NOTE = re.compile(r"kept as artifact (\w+)\]")
TRIM_NOTE = "\n[trimmed by the workbench"  # how trimming's note begins (app/agent/trimming.py)


async def _fit(ctx: TurnContext, history: list, answers: list[ToolMessage], context: ContextState, choice: object,
               write: Callable[[dict], None]) -> list[ToolMessage]:
    if not any(isinstance(a.artifact, StepResult) for a in answers):
        return answers
    model = await ctx.adapter.model_name()
    system, tools = system_message(ctx.scenario), scenario_tools(ctx.scenario, ctx.compact_tool_schemas)
    fitted_any: dict[int, ToolMessage] = {}
    for attempt in range(ROUNDS):
        conversation = to_openai([*history, *answers])
        fitted = await ctx.budget.measure(model, system, conversation, ctx.history_len, tools, choice, context)
        if fitted.limit is None or fitted.prompt_tokens is None:
            return answers
        excess = fitted.prompt_tokens + ctx.budget.reserve(fitted.limit) - fitted.limit.n_ctx
        if excess <= 0:
            break
        chars_per_token = request_chars([system, *fitted.conversation], tools) / max(fitted.prompt_tokens, 1)
        cuttable = [i for i, a in enumerate(answers) if isinstance(a.artifact, StepResult)]
        lengths = [len(_text(answers[i])) for i in cuttable]
        budget = int(sum(lengths) - excess * chars_per_token * (1.1 + 0.2 * attempt))
        cap = water_cap(lengths, budget)
        changed = False
        for i, length in zip(cuttable, lengths):
            if length <= cap:
                continue
            shrunk = await _cut(ctx, answers[i], cap)
            if shrunk is not None:
                answers[i] = fitted_any[i] = shrunk
                changed = True
        if not changed:
            break  # nothing more to cut: the model call says the request does not fit
    for i in sorted(fitted_any):
        await _record(ctx, fitted_any[i])
        _announce(write, fitted_any[i])
    return answers


async def _cut(ctx: TurnContext, answer: ToolMessage, cap: int) -> ToolMessage | None:
    """`answer` with its result trimmed to `cap` characters (its full text stored as an artifact
    if it was not already); None when trimming cannot make it shorter."""
    result = answer.artifact
    assert isinstance(result, StepResult)
    artifact_id = result.artifact_id or new_id()
    shaped = trim_tool_result(result.raw, cap, artifact_id, result.query)
    if not shaped.trimmed or len(shaped.context_text) >= len(_text(answer)):
        return None
    result.ranking = shaped.ranking_report()
    if result.artifact_id is None:
        await ctx.recorder.artifact(artifact_id=artifact_id, tool_name=result.name, call_id=result.call_id,
                                    content=shaped.full_text, context_chars=len(shaped.context_text))
        result.artifact_id = artifact_id
    return ToolMessage(content=shaped.context_text, tool_call_id=answer.tool_call_id, name=answer.name,
                       status=answer.status, id=answer.id, artifact=result)


async def _record(ctx: TurnContext, answer: ToolMessage) -> None:
    """The tool span says what the model sees now: the fitted text, its artifact, what the cut kept."""
    result = answer.artifact
    assert isinstance(result, StepResult)
    if result.span_id is not None:
        await ctx.recorder.tool_fitted(span_id=result.span_id, context_text=_text(answer),
                                       full_chars=len(result.full_text), artifact_id=result.artifact_id,
                                       ranking=result.ranking)


def _announce(write: Callable[[dict], None], answer: ToolMessage) -> None:
    result = answer.artifact
    assert isinstance(result, StepResult)
    write({"type": "tool_result", "tool_call_id": result.call_id, "name": result.name, "content": _text(answer),
           "error": None, "trimmed": True, "full_chars": len(result.full_text), "artifact_id": result.artifact_id,
           "duration_ms": round(result.duration_ms, 3), "span_id": result.span_id, "fitted": True,
           "ranking": result.ranking})


def _text(answer: ToolMessage) -> str:
    return answer.content if isinstance(answer.content, str) else str(answer.content)
