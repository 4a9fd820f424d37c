"""Assistants and threads over the workbench's scenarios, sessions and branches.

A thread is a branch: its id is the branch's id, its state the branch's LangGraph thread at the
branch's head (the end of its last completed turn, or its base), or at the latest checkpoint
while a turn runs or waits for an approval. A new thread is a new session's main branch; a
copy is a fork from the head (a new branch of the same session, so a new thread); deleting a
thread deletes its branch (the main branch only with its session, when it is the last one).
Every read goes to the same rows and checkpoints the workbench's own pages read.
"""

from __future__ import annotations

import asyncio
import re
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from langgraph.types import StateSnapshot
from langgraph_sdk import schema
from sqlmodel import Session, col, select

from app.db.checkpoints import branch_thread_id
from app.db.models import (
    ACTIVE_TURN_STATES,
    AgentSession,
    Approval,
    ApprovalStatus,
    Branch,
    BranchCreate,
    Turn,
)
from app.errors import Conflict, NotFound, WorkbenchError
from app.platform import wire
from app.services import branch_threads
from app.services import sessions as sessions_service
from app.services.turn_start import branch_start
from app.workbench import Workbench

#: a thread id a client may choose (a branch id: it names the LangGraph thread "branch-<id>")
THREAD_ID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.:-]{0,47}$")
MAX_PAGE = 1000


@dataclass
class ThreadRows:
    """What the database says of one thread: its branch, session, turns that matter, approvals."""

    branch: Branch
    session: AgentSession
    busy: Turn | None  # running or waiting for an approval
    last: Turn | None  # the branch's newest turn
    pending: list[Approval]


class Threads:
    def __init__(self, workbench: Workbench) -> None:
        self.workbench = workbench
        self.started = datetime.now().astimezone()

    # -- assistants ----------------------------------------------------------------------------
    def assistants(self) -> list[schema.Assistant]:
        return [wire.assistant(s, self.started) for s in self.workbench.catalog.list()]

    def scenario(self, assistant: str) -> Any:
        """The scenario an assistant id (or a graph id: the scenario's name) names; 404 otherwise."""
        for scenario in self.workbench.catalog.list():
            if assistant in (scenario.name, wire.assistant_id(scenario.name)):
                return scenario
        raise NotFound(f"unknown assistant {assistant!r}; the assistants are the scenarios: "
                       f"{', '.join(s.name for s in self.workbench.catalog.list())}", "unknown_assistant")

    # -- reading -------------------------------------------------------------------------------
    def rows(self, db: Session, thread_id: str) -> ThreadRows:
        branch = db.get(Branch, thread_id)
        if branch is None:
            raise NotFound(f"unknown thread {thread_id!r}", "unknown_thread")
        session = sessions_service.get_session(db, branch.session_id)
        busy = sessions_service.busy_turn(db, branch)
        last = db.exec(select(Turn).where(Turn.branch_id == branch.id)
                       .order_by(col(Turn.created_at).desc())).first()
        pending = list(db.exec(select(Approval).where(Approval.branch_id == branch.id,
                                                      Approval.status == ApprovalStatus.PENDING)
                               .order_by(col(Approval.created_at))).all())
        return ThreadRows(branch, session, busy, last, pending)

    def _rows(self, thread_id: str) -> ThreadRows:
        with Session(self.workbench.engine) as db:
            return self.rows(db, thread_id)

    async def current(self, rows: ThreadRows) -> StateSnapshot | None:
        """The branch's state now: its latest checkpoint while a turn holds it, else its head."""
        thread = branch_thread_id(rows.branch.id)
        if rows.busy is not None:
            snapshot = await self.workbench.graph.aget_state(branch_threads.thread_config(thread))
            return snapshot if snapshot.created_at is not None else None
        start = await asyncio.to_thread(self._start_checkpoint, rows.branch.id)
        return await branch_threads.snapshot_at(self.workbench.graph, thread, start) if start else None

    def _start_checkpoint(self, branch_id: str) -> str | None:
        with Session(self.workbench.engine) as db:
            branch = db.get(Branch, branch_id)
            assert branch is not None  # read just now
            return branch_start(db, branch).checkpoint_id

    async def thread(self, thread_id: str) -> schema.Thread:
        rows = await asyncio.to_thread(self._rows, thread_id)
        return await self._thread(rows)

    async def _thread(self, rows: ThreadRows) -> schema.Thread:
        snapshot = await self.current(rows)
        values = wire.state_values(snapshot.values) if snapshot is not None else {"messages": []}
        return wire.thread(rows.branch, rows.session.scenario, rows.session.title,
                           wire.thread_status(rows.busy, rows.last), values,
                           wire.interrupts_of(snapshot, rows.pending) if rows.busy is not None else [],
                           rows.last.finished_at or rows.last.created_at if rows.last else None)

    async def state(self, thread_id: str, checkpoint_id: str | None = None) -> schema.ThreadState:
        """The thread's state now, or at `checkpoint_id` of its LangGraph thread."""
        rows = await asyncio.to_thread(self._rows, thread_id)
        if checkpoint_id is None:
            snapshot = await self.current(rows)
            if snapshot is None:
                return wire.empty_state(thread_id, {"messages": []})
        else:
            snapshot = await branch_threads.snapshot_at(self.workbench.graph, branch_thread_id(rows.branch.id),
                                                        checkpoint_id)
            if snapshot is None:
                raise NotFound(f"unknown checkpoint {checkpoint_id!r} of thread {thread_id!r}", "unknown_checkpoint")
        return wire.thread_state(thread_id, snapshot, self._pending_at(rows, snapshot))

    @staticmethod
    def _pending_at(rows: ThreadRows, snapshot: StateSnapshot) -> list[Approval]:
        """The pending approvals a checkpoint waits on (those of its own tool calls)."""
        asked = {getattr(i, "value", {}).get("tool_call_id") for t in snapshot.tasks for i in t.interrupts
                 if isinstance(getattr(i, "value", None), dict)}
        return [a for a in rows.pending if a.tool_call_id in asked]

    async def history(self, thread_id: str, limit: int = 10, before: str | None = None,
                      metadata: dict | None = None) -> list[schema.ThreadState]:
        """The checkpoints of the branch's LangGraph thread, newest first."""
        rows = await asyncio.to_thread(self._rows, thread_id)
        config = branch_threads.thread_config(branch_thread_id(rows.branch.id))
        found: list[schema.ThreadState] = []
        async for snapshot in self.workbench.graph.aget_state_history(
                config, filter=metadata or None, limit=min(max(limit, 1), MAX_PAGE),
                before=branch_threads.thread_config(branch_thread_id(rows.branch.id), before) if before else None):
            found.append(wire.thread_state(thread_id, snapshot, self._pending_at(rows, snapshot)))
        return found

    async def search(self, *, metadata: dict | None = None, ids: list[str] | None = None,
                     status: str | None = None, limit: int = 10, offset: int = 0,
                     sort_order: str = "desc") -> list[schema.Thread]:
        """Branches, newest first, filtered by their metadata (graph_id, assistant_id,
        arbor_session_id, ...: wire.thread_metadata), ids and status."""
        metadata = dict(metadata or {})
        branches = await asyncio.to_thread(self._branches, metadata, ids, sort_order)
        found: list[schema.Thread] = []
        skipped = 0
        for branch_id in branches:
            rows = await asyncio.to_thread(self._rows, branch_id)
            meta = wire.thread_metadata(rows.branch, rows.session.scenario, rows.session.title)
            if any(meta.get(key) != value for key, value in metadata.items()):
                continue
            if status and wire.thread_status(rows.busy, rows.last) != status:
                continue
            if skipped < offset:
                skipped += 1
                continue
            found.append(await self._thread(rows))
            if len(found) >= min(max(limit, 1), MAX_PAGE):
                break
        return found

    def _branches(self, metadata: dict, ids: list[str] | None, sort_order: str) -> list[str]:
        with Session(self.workbench.engine) as db:
            query = select(Branch.id).join(AgentSession, col(AgentSession.id) == Branch.session_id)
            if ids:
                query = query.where(col(Branch.id).in_(ids))
            graph_id = metadata.get("graph_id")
            if graph_id is None and metadata.get("assistant_id"):
                graph_id = next((s.name for s in self.workbench.catalog.list()
                                 if wire.assistant_id(s.name) == metadata["assistant_id"]), "")
            if graph_id is not None:
                query = query.where(AgentSession.scenario == graph_id)
            if metadata.get("arbor_session_id"):
                query = query.where(Branch.session_id == metadata["arbor_session_id"])
            order = col(Branch.created_at).asc() if sort_order == "asc" else col(Branch.created_at).desc()
            return list(db.exec(query.order_by(order)).all())

    # -- writing -------------------------------------------------------------------------------
    async def create(self, graph_id: str | None, thread_id: str | None, title: str = "",
                     if_exists: str | None = None) -> schema.Thread:
        """A new session on scenario `graph_id`; the thread is its main branch (id `thread_id`
        when given). `if_exists` "do_nothing" answers an existing thread instead of 409."""
        if thread_id is not None and not THREAD_ID.match(thread_id):
            raise WorkbenchError(f"thread_id must match {THREAD_ID.pattern}", "invalid_thread_id", 422)
        if thread_id is not None:
            existing = await asyncio.to_thread(self._exists, thread_id)
            if existing and if_exists == "do_nothing":
                return await self.thread(thread_id)
            if existing:
                raise Conflict(f"thread {thread_id!r} exists", "thread_exists")
        if not graph_id:
            raise WorkbenchError("a thread is a session of one scenario: name it with graph_id (or metadata "
                                 "graph_id / assistant_id); GET /langgraph/assistants/search lists them",
                                 "graph_id_required", 422)
        scenario = self.scenario(graph_id)
        branch_id = await asyncio.to_thread(self._create_session, scenario.name, title, thread_id)
        return await self.thread(branch_id)

    def _exists(self, thread_id: str) -> bool:
        with Session(self.workbench.engine) as db:
            return db.get(Branch, thread_id) is not None

    def _create_session(self, scenario: str, title: str, branch_id: str | None) -> str:
        """sessions_service.create_session, with the main branch's id chosen."""
        with Session(self.workbench.engine) as db:
            session = AgentSession(scenario=scenario, title=title[:200])
            db.add(session)
            db.flush()
            main = Branch(session_id=session.id, name="main")
            if branch_id:
                main.id = branch_id
            db.add(main)
            db.flush()
            session.active_branch_id = main.id
            db.add(session)
            db.commit()
            return main.id

    async def copy(self, thread_id: str) -> schema.Thread:
        """Fork a new branch from the thread's head (the end of its last completed turn; a branch
        forked inside a turn and not yet continued is forked at the same checkpoint)."""
        rows = await asyncio.to_thread(self._rows, thread_id)
        start = await asyncio.to_thread(self._start, rows.branch.id)
        if start.cut is not None:
            request = BranchCreate(turn_id=start.cut.id, checkpoint_id=rows.branch.fork_checkpoint_id)
        else:
            request = BranchCreate(turn_id=rows.branch.head_turn_id)
        branch = await self.workbench.branches.fork(rows.session.id, request)
        return await self.thread(branch.id)

    def _start(self, branch_id: str) -> Any:
        with Session(self.workbench.engine) as db:
            branch = db.get(Branch, branch_id)
            assert branch is not None  # read just now
            return branch_start(db, branch)

    async def delete(self, thread_id: str) -> None:
        """Delete the branch; its session's main branch goes only with its session, when no other
        branch is left (409 otherwise, as the workbench refuses it)."""
        rows = await asyncio.to_thread(self._rows, thread_id)
        others = await asyncio.to_thread(self._other_branches, rows.branch)
        main = await asyncio.to_thread(self._is_main, rows.branch)
        if not main:
            await self.workbench.branches.delete(rows.session.id, rows.branch.id)
            return
        if others:
            raise Conflict(f"thread {thread_id!r} is its session's main branch and other branches fork from the "
                           "session; delete those threads first", "branch_is_main")
        with Session(self.workbench.engine) as db:
            session = sessions_service.get_session(db, rows.session.id)
            await self.workbench.delete_session(db, session)

    def _other_branches(self, branch: Branch) -> int:
        with Session(self.workbench.engine) as db:
            return len(db.exec(select(Branch.id).where(Branch.session_id == branch.session_id,
                                                       Branch.id != branch.id)).all())

    def _is_main(self, branch: Branch) -> bool:
        with Session(self.workbench.engine) as db:
            first = db.exec(select(Branch.id).where(Branch.session_id == branch.session_id)
                            .order_by(col(Branch.created_at), col(Branch.id))).first()
            return first == branch.id

    def busy_turn(self, thread_id: str) -> Turn | None:
        with Session(self.workbench.engine) as db:
            branch = db.get(Branch, thread_id)
            if branch is None:
                return None
            return db.exec(select(Turn).where(Turn.branch_id == branch.id,
                                              col(Turn.status).in_(ACTIVE_TURN_STATES))).first()
