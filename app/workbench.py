"""The objects one running workbench shares: settings, database, checkpointer, model adapter,
context budget, graph, services."""

from __future__ import annotations

import asyncio
from contextlib import AsyncExitStack
from dataclasses import dataclass, field
from typing import Any

from langgraph.checkpoint.base import BaseCheckpointSaver
from sqlalchemy.engine import Engine
from sqlmodel import Session
from starlette.concurrency import run_in_threadpool

from app.agent.context_budget import ContextBudget
from app.agent.graph import build_graph
from app.agent.model_client import ModelAdapter
from app.db.checkpoints import delete_threads, open_checkpointer
from app.db.engine import make_engine
from app.db.models import AgentSession
from app.scenario_catalog import ScenarioCatalog
from app.services import sessions as sessions_service
from app.services.branches import BranchService
from app.services.liveness import ProcessLiveness
from app.services.recovery import expire_lost_approvals, mark_interrupted_turns
from app.services.retention import PruneJob
from app.services.turns import TurnService
from app.settings import WorkbenchSettings
from app.telemetry import otlp


@dataclass
class Workbench:
    settings: WorkbenchSettings
    engine: Engine
    checkpointer: BaseCheckpointSaver
    adapter: ModelAdapter
    budget: ContextBudget
    catalog: ScenarioCatalog
    graph: Any
    turns: TurnService
    branches: BranchService
    pruning: PruneJob
    _stack: AsyncExitStack = field(repr=False, default_factory=AsyncExitStack)
    telemetry: otlp.Telemetry | None = None  # OTLP export, when the environment asks for it

    @classmethod
    async def open(cls, settings: WorkbenchSettings, catalog: ScenarioCatalog | None = None) -> Workbench:
        """Open the database and the LangGraph checkpointer, both where `settings.database_url` says."""
        settings.ensure_data_dir()
        engine = make_engine(settings.database_url)
        liveness = ProcessLiveness(engine)
        with Session(engine) as db:
            mark_interrupted_turns(db, liveness.alive)
        stack = AsyncExitStack()
        saver = await stack.enter_async_context(open_checkpointer(settings))
        graph = build_graph(checkpointer=saver)
        await expire_lost_approvals(engine, graph)  # after a crash: app/services/recovery.py
        adapter = ModelAdapter(settings)
        budget = ContextBudget(settings)
        catalog = catalog or ScenarioCatalog()
        turns = TurnService(settings, engine, graph, adapter, catalog, budget, owner=liveness.owner,
                            alive=liveness.alive)
        branches = BranchService(engine, graph, saver, turns.hints)
        stack.callback(liveness.close)
        pruning = PruneJob(engine, settings)  # retention (app/services/retention.py)
        pruning.start()
        telemetry = otlp.start()  # app/telemetry/otlp.py: on only with OTEL_EXPORTER_OTLP_ENDPOINT
        return cls(settings, engine, saver, adapter, budget, catalog, graph, turns, branches, pruning, stack,
                   telemetry)

    async def delete_session(self, db: Session, session: AgentSession) -> None:
        """Delete `session` with everything it owns: turns, branches, runs, traces, artifacts,
        approvals, and the LangGraph threads of its branches. Refused (Conflict) while a turn runs.

        Checkpoints go first: should that fail, no row has changed and the delete can simply be
        retried (deleting a thread twice is no error), where rows deleted first would leave
        checkpoints that nothing points to and nothing would ever delete.
        """
        thread_ids = await run_in_threadpool(sessions_service.deletable_session_threads, db, session)
        await delete_threads(self.checkpointer, thread_ids)
        await run_in_threadpool(sessions_service.delete_session, db, session)

    async def close(self) -> None:
        await self.pruning.stop()
        await self.turns.shutdown()
        await self.adapter.close()
        await self._stack.aclose()
        self.engine.dispose()
        await asyncio.to_thread(otlp.stop, self.telemetry)  # sends what is queued (bounded wait)
