"""The request body of one model step, built in one place for the graph and the preview API.

Its tools are the scenario's schemas, compacted unless ``compact_tools`` is off
(``ARBOR_COMPACT_TOOL_SCHEMAS``: app/agent/tool_schemas.py); the same scenario and setting give
the same bytes every step, which the server's prefix cache relies on.
"""

from __future__ import annotations

from typing import Any

from app.agent.context_budget import ContextBudget, FittedRequest
from app.agent.context_state import ContextState
from app.agent.model_client import ModelAdapter
from app.agent.routers import tool_choice_for_step
from app.agent.scenario_tools import openai_schema
from app.agent.tool_schemas import compact_tools


def step_body(adapter: ModelAdapter, scenario: Any, model: str, conversation: list[dict], *, step: int,
              max_steps: int, force_tool: bool, tool_choice: Any, cache_session: str,
              max_tokens: int | None = None, compact_tools: bool = True) -> dict:
    """Body of model step `step`: system prompt + conversation, the scenario's tools, tool_choice."""
    choice = tool_choice_for_step(step, max_steps, force_tool, tool_choice)
    messages = [system_message(scenario), *conversation]
    return adapter.build_body(model, messages, scenario_tools(scenario, compact_tools), choice, cache_session,
                              max_tokens)


async def fitted_step_body(budget: ContextBudget, adapter: ModelAdapter, scenario: Any, model: str,
                           conversation: list[dict], history_len: int, state: ContextState,
                           **step: Any) -> tuple[dict, FittedRequest]:
    """`step_body` of the conversation fitted to the context (compacted, max_tokens clamped).

    `history_len`: how many messages of `conversation` belong to past turns (the rest is the
    current turn, which compaction never touches); `state`: the branch's context state (its
    compaction level, its estimate). `step` takes step_body's keyword arguments.
    """
    choice = tool_choice_for_step(step["step"], step["max_steps"], step["force_tool"], step["tool_choice"])
    tools = scenario_tools(scenario, step.get("compact_tools", True))
    fitted = await budget.fit(model, system_message(scenario), conversation, history_len, tools, choice, state)
    body = step_body(adapter, scenario, model, fitted.conversation, max_tokens=fitted.max_tokens, **step)
    return body, fitted


def system_message(scenario: Any) -> dict:
    return {"role": "system", "content": scenario.system_prompt}


def scenario_tools(scenario: Any, compact: bool = True) -> list[dict]:
    """The `tools` of a request: the scenario's schemas, compacted when `compact`."""
    tools = [openai_schema(tool) for tool in scenario.tools]
    return compact_tools(tools) if compact else tools
