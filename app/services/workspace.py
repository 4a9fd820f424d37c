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

A side effect follows its turn (issue 35, item 7). A file is written *staged*: the turn that
wrote it sees it (a later step of the same turn lists the chapter it just added), nothing else
does: not the branch's file list, not a fork from the turn's end, not another turn. The turn's
completion publishes its files in the very transaction that records it `completed`
(`publish`), so there is no moment, crash included, at which a completed turn lacks its files
or a turn that did not complete shows one. A turn that ends failed or cancelled deletes its
staged files in the transaction that records that end (`discard`); a turn cut by a crash is
swept at the next start (app/services/recovery.py) and by every prune (`discard_abandoned`),
and is invisible meanwhile. Its retry therefore finds the branch as it was before the failed
turn and numbers its chapter the same. Staging, not writing and deleting afterwards, because
the branch's readers (the files page, a fork, a process on the same PostgreSQL) must never
see a file that may still be taken back, and a crash leaves no window in which they could.

A fork from a checkpoint inside a turn copies that turn's files written before the
checkpoint, staged or not, published on the fork: the fork's state at that checkpoint holds
the tool results that wrote them. A failed or cancelled turn has none left to copy.
"""

from __future__ import annotations

from datetime import UTC, datetime

from sqlalchemy import delete, or_, update
from sqlalchemy.engine import Engine
from sqlalchemy.exc import IntegrityError
from sqlmodel import Session, col, select

from app.db.engine import affected_rows
from app.db.models import Branch, Turn, WorkspaceFile, WorkspaceFilePublic
from app.services import sessions as sessions_service
from tools.workspace import check_path

_PUBLISHED = col(WorkspaceFile.staged).is_(None)
_STAGED = col(WorkspaceFile.staged).is_not(None)


class BranchWorkspace:
    """The `tools.workspace.Workspace` of one branch, for the tools of turn `turn_id`: the
    branch's published files and the turn's own staged ones; what it creates is staged."""

    def __init__(self, engine: Engine, session_id: str, branch_id: str, turn_id: str) -> None:
        self.engine, self.session_id, self.branch_id, self.turn_id = engine, session_id, branch_id, turn_id

    def _visible(self):
        return (col(WorkspaceFile.branch_id) == self.branch_id,
                or_(_PUBLISHED, col(WorkspaceFile.turn_id) == self.turn_id))

    def files(self, prefix: str = "") -> dict[str, str]:
        with Session(self.engine) as db:
            rows = db.exec(select(WorkspaceFile).where(*self._visible(),
                                                       col(WorkspaceFile.path).startswith(prefix, autoescape=True))
                           .order_by(col(WorkspaceFile.path))).all()
            return {row.path: row.content for row in rows}

    def read(self, path: str) -> str | None:
        with Session(self.engine) as db:
            row = db.exec(select(WorkspaceFile).where(*self._visible(), WorkspaceFile.path == path)).first()
            return row.content if row else None

    def create(self, path: str, content: str) -> None:
        row = WorkspaceFile(session_id=self.session_id, branch_id=self.branch_id, path=check_path(path),
                            content=content, turn_id=self.turn_id, staged=True)
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
        inside = (inside_before is not None and row.turn_id == fork_turn.id
                  and _utc(row.created_at) <= _utc(inside_before))
        if (row.turn_id in path and row.staged is None) or inside:  # copies are published: the fork's base
            db.add(WorkspaceFile(session_id=row.session_id, branch_id=branch.id, path=row.path, content=row.content,
                                 turn_id=row.turn_id, created_at=row.created_at))
            copied += 1
    return copied


def publish(db: Session, turn: Turn) -> int:
    """Make the files `turn` staged on its branch visible to every reader; how many. Not
    committed: the caller commits it with the turn's `completed`."""
    return affected_rows(db.execute(update(WorkspaceFile).where(col(WorkspaceFile.branch_id) == turn.branch_id,
                                                                col(WorkspaceFile.turn_id) == turn.id, _STAGED)
                                    .values(staged=None)))


def discard(db: Session, turn: Turn) -> int:
    """Delete the files `turn` staged on its branch (it ended failed or cancelled); how many.
    Not committed: the caller commits it with the turn's end."""
    return affected_rows(db.execute(delete(WorkspaceFile).where(col(WorkspaceFile.branch_id) == turn.branch_id,
                                                                col(WorkspaceFile.turn_id) == turn.id, _STAGED)))


def discard_abandoned(db: Session) -> int:
    """Delete staged files whose turn is neither running, paused nor completed (it failed, was
    cancelled, or is gone): those a crash left behind. How many; not committed."""
    alive = select(Turn.id).where(col(Turn.status).in_(("running", "awaiting_approval", "completed")))
    db.flush()  # a turn marked failed in this transaction counts as failed here
    return affected_rows(db.execute(delete(WorkspaceFile).where(_STAGED, col(WorkspaceFile.turn_id).not_in(alive))))


def _utc(moment: datetime) -> datetime:
    """Naive UTC: SQLite hands timestamps back without their zone, checkpoints carry it."""
    return moment.astimezone(UTC).replace(tzinfo=None) if moment.tzinfo else moment


def delete_files(db: Session, *, branch_id: str | None = None, session_id: str | None = None) -> None:
    """Delete the files of a branch, or of every branch of a session. Not committed."""
    query = select(WorkspaceFile).where(WorkspaceFile.branch_id == branch_id) if branch_id else \
        select(WorkspaceFile).where(WorkspaceFile.session_id == session_id)
    for row in db.exec(query).all():
        db.delete(row)


def list_files(db: Session, branch_id: str, with_content: bool) -> list[WorkspaceFilePublic]:
    """The branch's published files in path order (their text only when asked: a page lists
    many); files a turn has staged appear when it completes."""
    rows = db.exec(select(WorkspaceFile).where(WorkspaceFile.branch_id == branch_id, _PUBLISHED)
                   .order_by(col(WorkspaceFile.path))).all()
    return [WorkspaceFilePublic(path=r.path, chars=len(r.content), turn_id=r.turn_id, created_at=r.created_at,
                                content=r.content if with_content else None) for r in rows]
