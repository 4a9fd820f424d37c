"""The objects one running workbench shares: settings, database, model adapter, context budget,
graph, services."""

from __future__ import annotations

from contextlib import AsyncExitStack
from dataclasses import dataclass, field
from typing import Any

from langgraph.checkpoint.sqlite.aio import AsyncSqliteSaver
from sqlalchemy.engine import Engine
from sqlmodel import Session

from app.agent.context_budget import ContextBudget
from app.agent.graph import build_graph
from app.agent.model_client import ModelAdapter
from app.db.engine import make_engine
from app.scenario_catalog import ScenarioCatalog
from app.services.recovery import expire_lost_approvals, mark_interrupted_turns
from app.services.turns import TurnService
from app.settings import WorkbenchSettings


@dataclass
class Workbench:
    settings: WorkbenchSettings
    engine: Engine
    adapter: ModelAdapter
    budget: ContextBudget
    catalog: ScenarioCatalog
    graph: Any
    turns: TurnService
    _stack: AsyncExitStack = field(repr=False, default_factory=AsyncExitStack)

    @classmethod
    async def open(cls, settings: WorkbenchSettings, catalog: ScenarioCatalog | None = None) -> "Workbench":
        """Open the database and the LangGraph checkpointer (SQLite file in the data dir)."""
        settings.ensure_data_dir()
        engine = make_engine(settings.database_url)
        with Session(engine) as db:
            mark_interrupted_turns(db)
        stack = AsyncExitStack()
        saver = await stack.enter_async_context(AsyncSqliteSaver.from_conn_string(str(settings.checkpoint_path)))
        graph = build_graph(checkpointer=saver)
        await expire_lost_approvals(engine, graph)  # after a crash: app/services/recovery.py
        adapter = ModelAdapter(settings)
        budget = ContextBudget(settings)
        catalog = catalog or ScenarioCatalog()
        turns = TurnService(settings, engine, graph, adapter, catalog, budget)
        return cls(settings, engine, adapter, budget, catalog, graph, turns, stack)

    async def close(self) -> None:
        await self.turns.shutdown()
        await self.adapter.close()
        await self._stack.aclose()
        self.engine.dispose()
