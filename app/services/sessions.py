"""Sessions as trees of turns, and branches as pointers into them.

The path root -> branch head is the branch's story (the turns, their messages as recorded,
their traces); the conversation the model sees lives in the branch's LangGraph thread
(app/services/branch_threads.py). Forking from turn T makes a branch whose head is T: it
shares T's history exactly, and switching branches only moves a pointer
(`active_branch_id`). Branch forks and deletes: app/services/branches.py.
"""

from __future__ import annotations

from sqlmodel import Session, col, select

from app.db.checkpoints import branch_thread_id
from app.db.models import (
    ACTIVE_TURN_STATES,
    AgentSession,
    Approval,
    ApprovalPublic,
    Artifact,
    Branch,
    BranchPublic,
    Run,
    RunOptions,
    SessionDetail,
    Span,
    Turn,
    TurnEvent,
    TurnPublic,
    WorkspaceFile,
)
from app.errors import Conflict, NotFound, WorkbenchError


def create_session(db: Session, scenario: str, title: str = "") -> AgentSession:
    session = AgentSession(scenario=scenario, title=title)
    db.add(session)
    db.flush()
    main = Branch(session_id=session.id, name="main")
    db.add(main)
    db.flush()
    session.active_branch_id = main.id
    db.add(session)
    db.commit()
    db.refresh(session)
    return session


def latest_run(db: Session, turn_id: str) -> Run | None:
    """The newest run of turn `turn_id` (a retried turn has one; a resumed one keeps its run)."""
    return db.exec(select(Run).where(Run.turn_id == turn_id).order_by(col(Run.started_at).desc())).first()


def get_session(db: Session, session_id: str) -> AgentSession:
    session = db.get(AgentSession, session_id)
    if session is None:
        raise NotFound(f"unknown session {session_id!r}", "unknown_session")
    return session


def get_branch(db: Session, session: AgentSession, branch_id: str | None) -> Branch:
    """The branch `branch_id` of `session` (its active branch when None)."""
    branch_id = branch_id or session.active_branch_id
    branch = db.get(Branch, branch_id) if branch_id else None
    if branch is None:
        raise NotFound(f"unknown branch {branch_id!r}", "unknown_branch")
    if branch.session_id != session.id:
        raise WorkbenchError(f"branch {branch_id!r} belongs to another session", "branch_not_in_session")
    return branch


def get_turn(db: Session, turn_id: str) -> Turn:
    turn = db.get(Turn, turn_id)
    if turn is None:
        raise NotFound(f"unknown turn {turn_id!r}", "unknown_turn")
    return turn


def path_to(db: Session, head_turn_id: str | None) -> list[Turn]:
    """The turns from the root to `head_turn_id`, in order: one query (a recursive CTE walking
    the parent pointers up from the head), however long the branch (SQLite and PostgreSQL)."""
    if head_turn_id is None:
        return []
    up = select(Turn.id, Turn.parent_turn_id).where(Turn.id == head_turn_id).cte("path", recursive=True)
    up = up.union_all(select(Turn.id, Turn.parent_turn_id).join(up, col(Turn.id) == up.c.parent_turn_id))
    path = list(db.exec(select(Turn).join(up, col(Turn.id) == up.c.id).order_by(col(Turn.depth))).all())
    if not path:
        raise NotFound(f"unknown turn {head_turn_id!r}", "unknown_turn")
    return path


def history(db: Session, branch: Branch) -> list[dict]:
    """The conversation of `branch` as its turns recorded it (OpenAI messages, no system
    prompt): what seeds its thread where no checkpoint holds it (app/services/turns.py)."""
    messages: list[dict] = []
    for turn in path_to(db, branch.head_turn_id):
        messages.extend(turn.messages or [])
    return messages


def turn_history_len(db: Session, turn: Turn) -> int:
    """How many messages of its thread's state belonged to earlier turns when `turn` started."""
    run = db.exec(select(Run).where(Run.turn_id == turn.id).order_by(col(Run.started_at))).first()
    return RunOptions.of(run).history_len or 0


def fork_source(db: Session, session: AgentSession, turn_id: str, completed: bool) -> Turn:
    """Turn `turn_id` of `session`, to fork from (from its end: `completed` required)."""
    turn = get_turn(db, turn_id)
    if turn.session_id != session.id:
        raise WorkbenchError(
            f"turn {turn_id!r} belongs to session {turn.session_id!r}, not {session.id!r}; "
            "a branch can only fork from a turn of its own session", "turn_not_in_session")
    if completed and turn.status != "completed":
        raise Conflict(f"turn {turn_id!r} is {turn.status}; fork from a completed turn, or from a checkpoint "
                       "inside it", "turn_not_completed")
    return turn


def add_branch(db: Session, session: AgentSession, branch: Branch) -> Branch:
    """Record the forked `branch` (named "branch-<n>" when unnamed) and make it active."""
    if not branch.name:
        count = len(db.exec(select(Branch).where(Branch.session_id == session.id, Branch.id != branch.id)).all())
        branch.name = f"branch-{count + 1}"
    db.add(branch)
    db.flush()
    session.active_branch_id = branch.id
    db.add(session)
    db.commit()
    db.refresh(branch)
    return branch


def activate_branch(db: Session, session: AgentSession, branch_id: str) -> AgentSession:
    branch = get_branch(db, session, branch_id)
    session.active_branch_id = branch.id
    db.add(session)
    db.commit()
    db.refresh(session)
    return session


def busy_turn(db: Session, branch: Branch) -> Turn | None:
    """A turn of `branch` that is still running or waiting for the operator, if any."""
    return db.exec(select(Turn).where(Turn.branch_id == branch.id, col(Turn.status).in_(ACTIVE_TURN_STATES))).first()


def session_detail(db: Session, session: AgentSession) -> SessionDetail:
    branches = db.exec(select(Branch).where(Branch.session_id == session.id).order_by(col(Branch.created_at))).all()
    turns = db.exec(select(Turn).where(Turn.session_id == session.id).order_by(col(Turn.created_at))).all()
    approvals = db.exec(select(Approval).where(Approval.session_id == session.id,
                                               Approval.status == "pending")).all()
    return SessionDetail(
        **session.model_dump(),
        branches=[BranchPublic.model_validate(b) for b in branches],
        turns=[TurnPublic.model_validate(t) for t in turns],
        pending_approvals=[ApprovalPublic.model_validate(a) for a in approvals],
    )


def deletable_session_threads(db: Session, session: AgentSession) -> list[str]:
    """The LangGraph threads of `session` (its branches', and those of runs recorded before
    threads were per branch): their checkpoints go with the session; Conflict while a turn of
    it runs, which would write to them."""
    _refuse_while_running(db, session)
    branches = db.exec(select(Branch.id).where(Branch.session_id == session.id)).all()
    runs = db.exec(select(Run.thread_id).where(Run.session_id == session.id)).all()
    return sorted({*map(branch_thread_id, branches), *runs})


def _refuse_while_running(db: Session, session: AgentSession) -> None:
    if db.exec(select(Turn).where(Turn.session_id == session.id, col(Turn.status) == "running")).first():
        raise Conflict(f"session {session.id!r} has a running turn; delete it when the turn ends", "session_busy")


def delete_session(db: Session, session: AgentSession) -> None:
    """Delete the rows of `session` (its checkpoints are the caller's: `Workbench.delete_session`)."""
    _refuse_while_running(db, session)
    for model in (Span, Artifact, Approval, TurnEvent, Run, WorkspaceFile):
        for row in db.exec(select(model).where(model.session_id == session.id)).all():
            db.delete(row)
    db.flush()
    # Turns reference each other (parent) and branches; clear the pointers first.
    branches = db.exec(select(Branch).where(Branch.session_id == session.id)).all()
    turns = db.exec(select(Turn).where(Turn.session_id == session.id)).all()
    for turn in turns:
        turn.parent_turn_id = None
        db.add(turn)
    session.active_branch_id = None
    db.add(session)
    db.flush()
    for turn in turns:
        db.delete(turn)
    db.flush()
    for branch in branches:
        db.delete(branch)
    db.flush()
    db.delete(session)
    db.commit()

