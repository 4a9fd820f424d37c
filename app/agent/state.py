"""The graph state: langchain-core messages plus loop bookkeeping, with reducers."""

from __future__ import annotations

from typing import Annotated, TypedDict, cast

from langchain_core.messages import AIMessage, AnyMessage, HumanMessage
from langgraph.graph.message import add_messages

from app.agent.context_state import advance


def merge_decisions(left: dict | None, right: dict | None) -> dict:
    """Reducer: operator decisions accumulate by tool-call id."""
    return {**(left or {}), **(right or {})}


class AgentState(TypedDict, total=False):
    # The conversation without the system prompt (the model node prepends it), as
    # langchain-core messages; app/agent/messages.py turns them into the OpenAI dicts that
    # the request body, the trace and the manifest record.
    messages: Annotated[list[AnyMessage], add_messages]
    steps: int  # model calls made in this turn
    max_steps: int  # the step budget of this turn
    awaiting: list[str]  # tool-call ids of the last model message that need the operator
    decisions: Annotated[dict[str, dict], merge_decisions]  # tool-call id -> {"approved", "comment"}
    final_answer: str | None
    outcome: str | None  # answered, budget_exhausted, tool_call_cut, no_tool_call, context_full (graph.py)
    # the branch's compaction level (forward only) and token estimate: app/agent/context_state.py
    context_fit: Annotated[dict, advance]


def last_model_message(state: AgentState) -> AIMessage:
    """The last message of the history, where the graph reads it: the model's (the nodes and the
    router after the model node)."""
    return cast(AIMessage, state["messages"][-1])


def turn_question(messages: list) -> str:
    """The current turn's question: the text of the last user message of the history (a turn
    has one, its input; the tool loop adds none). Empty when there is none (a continued turn
    whose message was compacted away cannot happen: compaction never touches the current turn)."""
    for message in reversed(messages):
        if isinstance(message, HumanMessage):
            content = message.content
            if isinstance(content, str):
                return content
            # a list of content parts (text and others): its text parts
            return " ".join(p.get("text", "") if isinstance(p, dict) else str(p) for p in content)
    return ""
