"""What a graph run needs besides its state: passed as LangGraph's runtime context.

The graph itself is built once per app; the scenario, ids, model adapter and recorder of a
particular turn travel in this context (rebuilt from the database when an approval resumes).
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cached_property
from typing import Any

from app.agent.cache_hints import CacheHints, hint_key
from app.agent.chat_model import ArborChatModel
from app.agent.context_budget import ContextBudget
from app.agent.model_client import ModelAdapter
from app.tracing import TraceRecorder
from tools.base import ToolContext


@dataclass
class TurnContext:
    session_id: str
    branch_id: str
    turn_id: str
    run_id: str
    scenario: Any  # scenarios.scenario.Scenario (duck-typed: system_prompt, tools, tool(name))
    adapter: ModelAdapter
    budget: ContextBudget
    recorder: TraceRecorder
    tool_context: ToolContext
    tool_budget_chars: int
    hints: CacheHints
    force_tool: bool = False
    tool_choice: str | dict | None = None
    history_len: int = 0  # messages of the conversation that belong to earlier turns
    compact_tool_schemas: bool = True  # ARBOR_COMPACT_TOOL_SCHEMAS (app/agent/tool_schemas.py)

    @cached_property
    def chat_model(self) -> ArborChatModel:
        """The turn's model behind langchain-core's chat model interface."""
        return ArborChatModel(adapter=self.adapter)

    @property
    def cache_session(self) -> str:
        """The session key of the cache hints: one per branch of a session."""
        return hint_key(self.session_id, self.branch_id)
