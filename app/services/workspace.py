"""Branch workspaces: the files tools write (tools/workspace.py), as rows of the database.

A branch owns its files (`WorkspaceFile` rows with its id). A tool reads and writes them
through a `BranchWorkspace` bound to its turn's branch; nothing goes to the filesystem, so
the files live wherever the workbench's database does (SQLite or PostgreSQL, shared by every
workbench process).

A fork starts from its parent's files at the fork point (`copy_at_fork`): those written by the
turns on the path to the turn it forks from (the parent's own, and those it copied from its
own parent, which keep the id of the turn that wrote them), and, for a fork from a checkpoint
inside that turn, the turn's files written before the checkpoint. Files are written once, so
this set is exact. The copies are the fork's own: what either side writes later, the other
never sees. Deleting a branch or a session deletes its rows (app/services/branches.py,
app/services/sessions.py).
"""

from __future__ import annotations

from datetime import datetime, timezone

from sqlalchemy.engine import Engine
from sqlalchemy.exc import IntegrityError
from sqlmodel import Session, col, select

from app.db.models import Branch, Turn, WorkspaceFile, WorkspaceFilePublic
from app.services import sessions as sessions_service
from tools.workspace import check_path


class BranchWorkspace:
    """The `tools.workspace.Workspace` of one branch, for the tools of turn `turn_id`."""

    def __init__(self, engine: Engine, session_id: str, branch_id: str, turn_id: str) -> None:
        self.engine, self.session_id, self.branch_id, self.turn_id = engine, session_id, branch_id, turn_id

    def files(self, prefix: str = "") -> dict[str, str]:
        with Session(self.engine) as db:
            rows = db.exec(select(WorkspaceFile).where(WorkspaceFile.branch_id == self.branch_id,
                                                       col(WorkspaceFile.path).startswith(prefix, autoescape=True))
                           .order_by(col(WorkspaceFile.path))).all()
            return {row.path: row.content for row in rows}

    def read(self, path: str) -> str | None:
        with Session(self.engine) as db:
            row = db.exec(select(WorkspaceFile).where(WorkspaceFile.branch_id == self.branch_id,
                                                      WorkspaceFile.path == path)).first()
            return row.content if row else None

    def create(self, path: str, content: str) -> None:
        row = WorkspaceFile(session_id=self.session_id, branch_id=self.branch_id, path=check_path(path),
                            content=content, turn_id=self.turn_id)
        with Session(self.engine) as db:
            db.add(row)
            try:
                db.commit()
            except IntegrityError:  # (branch, path) is unique: another writer was first
                db.rollback()
                raise FileExistsError(path) from None


def copy_at_fork(db: Session, branch: Branch, fork_turn: Turn | None, inside_before: datetime | None) -> int:
    """Give the new `branch` (forked from the end of `fork_turn`, or from a checkpoint inside it
    taken at `inside_before`) copies of its parent's files at that point; how many. Not committed."""
    if fork_turn is None:  # an empty branch starts with no files
        return 0
    if inside_before is None:
        path = [t.id for t in sessions_service.path_to(db, fork_turn.id)]
    else:
        path = [t.id for t in sessions_service.path_to(db, fork_turn.parent_turn_id)]
    rows = db.exec(select(WorkspaceFile).where(WorkspaceFile.branch_id == fork_turn.branch_id)).all()
    copied = 0
    for row in rows:
        inside = inside_before is not None and row.turn_id == fork_turn.id and _utc(row.created_at) <= _utc(inside_before)
        if row.turn_id in path or inside:
            db.add(WorkspaceFile(session_id=row.session_id, branch_id=branch.id, path=row.path, content=row.content,
                                 turn_id=row.turn_id, created_at=row.created_at))
            copied += 1
    return copied


def _utc(moment: datetime) -> datetime:
    """Naive UTC: SQLite hands timestamps back without their zone, checkpoints carry it."""
    return moment.astimezone(timezone.utc).replace(tzinfo=None) if moment.tzinfo else moment


def delete_files(db: Session, *, branch_id: str | None = None, session_id: str | None = None) -> None:
    """Delete the files of a branch, or of every branch of a session. Not committed."""
    query = select(WorkspaceFile).where(WorkspaceFile.branch_id == branch_id) if branch_id else \
        select(WorkspaceFile).where(WorkspaceFile.session_id == session_id)
    for row in db.exec(query).all():
        db.delete(row)


def list_files(db: Session, branch_id: str, with_content: bool) -> list[WorkspaceFilePublic]:
    """The branch's files in path order (their text only when asked: a page lists many)."""
    rows = db.exec(select(WorkspaceFile).where(WorkspaceFile.branch_id == branch_id)
                   .order_by(col(WorkspaceFile.path))).all()
    return [WorkspaceFilePublic(path=r.path, chars=len(r.content), turn_id=r.turn_id, created_at=r.created_at,
                                content=r.content if with_content else None) for r in rows]
