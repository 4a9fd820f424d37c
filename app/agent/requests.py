"""The request body of one model step, built in one place for the graph and the preview API."""

from __future__ import annotations

from typing import Any

from app.agent.model_client import ModelAdapter
from app.agent.routers import tool_choice_for_step


def step_body(adapter: ModelAdapter, scenario: Any, model: str, conversation: list[dict], *, step: int,
              max_steps: int, force_tool: bool, tool_choice: Any, cache_session: str) -> dict:
    """Body of model step `step`: system prompt + conversation, the scenario's tools, tool_choice."""
    tools = [tool.openai_schema() for tool in scenario.tools]
    choice = tool_choice_for_step(step, max_steps, force_tool, tool_choice)
    messages = [{"role": "system", "content": scenario.system_prompt}, *conversation]
    return adapter.build_body(model, messages, tools, choice, cache_session)
