"""Branches on LangGraph threads: fork, list checkpoints, delete.

A fork is a new branch whose thread starts from a checkpoint of the parent's thread:
- from the end of turn T (`turn_id`): its head is T, its first turn adds a message after T;
- from a checkpoint inside turn T (`turn_id` + `checkpoint_id`, one of
  `GET .../branches/{id}/checkpoints`), e.g. before a tool result: its head is T's parent
  and its first turn *continues* T from there (same message, the graph runs its pending
  step: the tool again, then the model), as LangGraph replays from a checkpoint. A
  checkpoint with nothing pending is T's end, so that fork is the first kind.
The state is copied into the new thread (app/services/branch_threads.py); the SQL rows keep
the tree (`fork_turn_id`, `head_turn_id`, `fork_checkpoint_id`) and the name, and the
branch gets copies of its parent's files at the fork point (app/services/workspace.py).

Deleting a branch deletes its turns, runs, traces, event journals, artifacts, approvals and files, its checkpoint
thread, and tells the inference server the branch is done (a cache hint release). Refused:
the session's first branch (main: the root its other branches fork from), a branch with a
running turn (it writes to the thread), and a branch that other branches fork from (their
turn trees hang on its turns: delete those first). A paused turn (awaiting approval) does
not block: nothing runs, and its pending approval goes with the branch.
"""

from __future__ import annotations

import asyncio
from datetime import datetime
from typing import Any

from langgraph.checkpoint.base import BaseCheckpointSaver
from sqlalchemy.engine import Engine
from sqlmodel import Session, col, select

from app.agent.cache_hints import CacheHints, hint_key
from app.db.checkpoints import branch_thread_id, delete_threads
from app.db.models import AgentSession, Approval, Artifact, Branch, BranchCreate, Run, Span, Turn, TurnEvent, new_id
from app.errors import Conflict, NotFound, WorkbenchError
from app.services import branch_threads, workspace
from app.services import sessions as sessions_service


class BranchService:
    def __init__(self, engine: Engine, graph: Any, checkpointer: BaseCheckpointSaver, hints: CacheHints) -> None:
        self.engine, self.graph, self.checkpointer, self.hints = engine, graph, checkpointer, hints

    # -- fork --------------------------------------------------------------------------------
    async def fork(self, session_id: str, request: BranchCreate) -> Branch:
        """Fork a branch (see the module docstring); it becomes the session's active branch."""
        turn = await asyncio.to_thread(self._fork_turn, session_id, request)
        branch = Branch(id=new_id(), session_id=session_id, name=request.name or "",
                        fork_turn_id=turn.id if turn else None, head_turn_id=turn.id if turn else None)
        source = request.checkpoint_id or (turn.end_checkpoint_id if turn else None)
        inside_before = None  # for a fork inside the turn: when its checkpoint was taken
        if source is not None:  # None: an empty branch, or a turn from before checkpoints (seeded later)
            assert turn is not None  # a checkpoint comes with its turn (_fork_turn)
            snapshot = await self._fork_snapshot(turn, source, explicit=request.checkpoint_id is not None)
            if snapshot.next:  # inside the turn: the branch continues it
                branch.head_turn_id = turn.parent_turn_id
                inside_before = datetime.fromisoformat(snapshot.created_at)
            elif turn.status != "completed":
                raise Conflict(f"turn {turn.id!r} is {turn.status}: its checkpoint {source!r} ends nothing to "
                               "continue from", "turn_not_completed")
            branch.fork_checkpoint_id = source
            branch.base_checkpoint_id = await branch_threads.copy_checkpoint(
                self.graph, snapshot, branch_thread_id(branch.id))
        try:
            return await asyncio.to_thread(self._record_fork, session_id, branch, turn, inside_before)
        except BaseException:
            await delete_threads(self.checkpointer, [branch_thread_id(branch.id)])  # nothing points to it
            raise

    def _fork_turn(self, session_id: str, request: BranchCreate) -> Turn | None:
        with Session(self.engine) as db:
            session = sessions_service.get_session(db, session_id)
            if request.turn_id is None:
                if request.checkpoint_id is not None:
                    raise WorkbenchError("checkpoint_id needs the turn_id of the turn it belongs to",
                                         "checkpoint_without_turn", 422)
                return None
            return sessions_service.fork_source(db, session, request.turn_id,
                                                completed=request.checkpoint_id is None)

    async def _fork_snapshot(self, turn: Turn, checkpoint_id: str, explicit: bool) -> Any:
        thread_id = branch_thread_id(turn.branch_id)
        snapshot = await branch_threads.snapshot_at(self.graph, thread_id, checkpoint_id)
        if snapshot is None:
            raise NotFound(f"unknown checkpoint {checkpoint_id!r} on the branch of turn {turn.id!r}",
                           "unknown_checkpoint")
        metadata = snapshot.metadata or {}
        if explicit and metadata.get("turn_id") != turn.id:
            raise WorkbenchError(f"checkpoint {checkpoint_id!r} is not inside turn {turn.id!r} (it belongs to "
                                 f"{metadata.get('turn_id')!r})", "checkpoint_not_in_turn")
        if not branch_threads.is_forkable(snapshot):
            raise WorkbenchError(f"checkpoint {checkpoint_id!r} is an input checkpoint; fork from the one before it",
                                 "checkpoint_not_forkable", 422)
        return snapshot

    def _record_fork(self, session_id: str, branch: Branch, turn: Turn | None,
                     inside_before: datetime | None) -> Branch:
        with Session(self.engine) as db:
            session = sessions_service.get_session(db, session_id)
            db.add(branch)
            db.flush()
            workspace.copy_at_fork(db, branch, turn, inside_before)  # committed with the branch
            return sessions_service.add_branch(db, session, branch)

    # -- checkpoints -------------------------------------------------------------------------
    async def checkpoints(self, session_id: str, branch_id: str) -> list[dict]:
        """The checkpoints of the branch's thread a fork can start from, newest first."""
        branch = await asyncio.to_thread(self._branch, session_id, branch_id)
        return await branch_threads.list_checkpoints(self.graph, branch_thread_id(branch.id))

    def _branch(self, session_id: str, branch_id: str) -> Branch:
        with Session(self.engine) as db:
            return sessions_service.get_branch(db, sessions_service.get_session(db, session_id), branch_id)

    # -- delete ------------------------------------------------------------------------------
    async def delete(self, session_id: str, branch_id: str) -> None:
        """Delete the branch with its rows and checkpoints, and release its cache on the server.

        Checkpoints go first (as for a session): should that fail, no row has changed and the
        delete can be retried; rows deleted first would leave a thread nothing points to.
        """
        thread_ids = await asyncio.to_thread(self._deletable_threads, session_id, branch_id)
        await delete_threads(self.checkpointer, thread_ids)
        await asyncio.to_thread(self._delete_rows, session_id, branch_id)
        await self.hints.release([hint_key(session_id, branch_id)])

    def _deletable_threads(self, session_id: str, branch_id: str) -> list[str]:
        with Session(self.engine) as db:
            branch = self._refuse_delete(db, session_id, branch_id)
            runs = db.exec(select(Run.thread_id).where(Run.branch_id == branch.id)).all()
            return sorted({branch_thread_id(branch.id), *runs})

    def _refuse_delete(self, db: Session, session_id: str, branch_id: str) -> Branch:
        session = sessions_service.get_session(db, session_id)
        branch = sessions_service.get_branch(db, session, branch_id)
        if branch.id == _root_branch(db, session).id:
            raise Conflict(f"branch {branch.name!r} is the session's main branch; delete the session instead",
                           "branch_is_main")
        turns = db.exec(select(Turn).where(Turn.branch_id == branch.id)).all()
        if any(t.status == "running" for t in turns):
            raise Conflict(f"branch {branch.name!r} has a running turn; delete it when the turn ends", "branch_busy")
        ids = [t.id for t in turns]
        children = db.exec(select(Branch.name).where(
            Branch.session_id == session.id, Branch.id != branch.id,
            col(Branch.fork_turn_id).in_(ids) | col(Branch.head_turn_id).in_(ids))).all()
        if children:  # (a branch forked from a child hangs on the child's turns, so this finds its root)
            names = ", ".join(repr(n) for n in children)
            raise Conflict(f"branch {branch.name!r} has branches forked from it ({names}); delete them first",
                           "branch_has_children")
        return branch

    def _delete_rows(self, session_id: str, branch_id: str) -> None:
        with Session(self.engine) as db:
            branch = self._refuse_delete(db, session_id, branch_id)  # again: a turn may have started since
            turns = db.exec(select(Turn).where(Turn.branch_id == branch.id)).all()
            ids = [t.id for t in turns]
            for model in (Span, Approval, TurnEvent, Run):
                for row in db.exec(select(model).where(model.branch_id == branch.id)).all():
                    db.delete(row)
            for row in db.exec(select(Artifact).where(col(Artifact.turn_id).in_(ids))).all():
                db.delete(row)
            workspace.delete_files(db, branch_id=branch.id)
            db.flush()
            for turn in turns:  # turns reference each other (parent): clear the pointers first
                turn.parent_turn_id = None
                db.add(turn)
            db.flush()
            for turn in turns:
                db.delete(turn)
            session = sessions_service.get_session(db, session_id)
            if session.active_branch_id == branch.id:
                session.active_branch_id = _root_branch(db, session).id
                db.add(session)
            db.flush()
            db.delete(branch)
            db.commit()


def _root_branch(db: Session, session: AgentSession) -> Branch:
    """The session's main branch: its first (made with the session)."""
    branch = db.exec(select(Branch).where(Branch.session_id == session.id)
                     .order_by(col(Branch.created_at), col(Branch.id))).first()
    assert branch is not None  # made with the session, never deleted
    return branch
