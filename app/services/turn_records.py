"""Turn records: the states a turn and its run go through, one function per transition.

    begin ──> running ──pause──> awaiting_approval ──resume──> running
              running ──complete──> completed          (the branch head moves to it)
    running | awaiting_approval ──fail──> failed       (a model or workbench failure; expire)
    running | awaiting_approval ──cancel──> cancelled  (stopped by the user)

A turn and the run executing it move together (a resumed turn keeps its run), so each
function sets both; the statuses are `TurnStatus` (app/db/models.py), stored as the same
strings as ever. The files a turn's tools wrote are staged until it ends: `complete`
publishes them in the transaction that records it, every other end discards them
(app/services/workspace.py). Each function changes rows in `db`; the caller commits, so a
transition and whatever it is recorded with (an event, a branch head) are one transaction.
"""

from __future__ import annotations

from datetime import datetime
from typing import cast

from sqlalchemy import CursorResult, update
from sqlmodel import Session, col, select

from app.db.models import (
    ACTIVE_TURN_STATES,
    Approval,
    ApprovalStatus,
    Branch,
    Run,
    RunOptions,
    Turn,
    TurnStatus,
    utcnow,
)
from app.errors import Conflict, NotFound
from app.services import branch_threads, workspace
from app.services.turn_journal import append_event


def begin(db: Session, *, session_id: str, branch: Branch, parent: Turn | None, message: str, thread_id: str,
          owner: str | None, options: RunOptions) -> tuple[Turn, Run]:
    """A new `running` turn on `branch` after its head `parent`, and its run. The flush raises
    IntegrityError when the branch already holds a running or paused turn (models.Turn's unique
    partial index: the database holds the branch lock, whichever process asks)."""
    turn = Turn(session_id=session_id, branch_id=branch.id, parent_turn_id=branch.head_turn_id,
                depth=(parent.depth + 1) if parent else 0, user_message=message, status=TurnStatus.RUNNING)
    db.add(turn)
    db.flush()
    run = Run(session_id=session_id, branch_id=branch.id, turn_id=turn.id, thread_id=thread_id, owner=owner,
              status=TurnStatus.RUNNING, options=options.stored())
    db.add(run)
    return turn, run


def record_start(db: Session, turn: Turn, run: Run, checkpoint_id: str, history_len: int, base: bool) -> None:
    """The checkpoint `turn` starts from, and how many messages of its state are earlier turns';
    `base`: a checkpoint just written as its branch's base (a retry starts there too)."""
    turn.start_checkpoint_id = checkpoint_id
    run.options = RunOptions.of(run).model_copy(update={"history_len": history_len}).stored()
    _add(db, turn, run)
    if base:
        branch = _branch(db, turn)
        branch.base_checkpoint_id = checkpoint_id
        db.add(branch)


def pause(db: Session, turn: Turn, run: Run, request: dict) -> dict:
    """running → awaiting_approval, with the pending approval of `request` (the graph's
    interrupt: tool_call_id, tool_name, arguments), recorded once however often it is asked.
    Returns the `approval_request` event, journaled here, with the pause: whoever sees the
    turn paused (and may cancel it, or decide, from any process) sees its event too, and a
    `cancelled` row appended to the segment comes after it (the caller has the journal write
    what the turn streamed before, app/services/turns.py)."""
    approval = db.exec(select(Approval).where(Approval.run_id == run.id,
                                              Approval.tool_call_id == request["tool_call_id"])).first()
    if approval is None:
        approval = Approval(session_id=turn.session_id, branch_id=turn.branch_id, turn_id=turn.id, run_id=run.id,
                            tool_call_id=request["tool_call_id"], tool_name=request["tool_name"],
                            arguments=request.get("arguments"))
        db.add(approval)
    _move(db, TurnStatus.AWAITING_APPROVAL, turn, run)
    event = {"type": "approval_request", "approval_id": approval.id, "turn_id": turn.id,
             "tool_call_id": approval.tool_call_id, "tool_name": approval.tool_name, "arguments": approval.arguments}
    db.flush()  # the approval counts as pending, not decided: the segment is the one streamed
    append_event(db, turn, event)
    return event


def decide(db: Session, approval_id: str, approved: bool, comment: str,
           decided_by: str | None) -> tuple[Turn, Run]:
    """Record the decision on pending approval `approval_id`: its paused turn and run, to resume.
    NotFound, or Conflict for an approval decided already (or meanwhile) or no longer paused.
    The claim is in the database: of two processes deciding at once, one updates the pending
    row, the other finds it decided (PostgreSQL re-checks the WHERE after the first commits) and
    answers 409, so one turn never resumes twice."""
    approval = db.get(Approval, approval_id)
    if approval is None:
        raise NotFound(f"unknown approval {approval_id!r}", "unknown_approval")
    turn = lock_turn(db, approval.turn_id)  # a cancel of the turn waits for this decision, or this for it
    db.refresh(approval)
    if approval.status != ApprovalStatus.PENDING:
        raise Conflict(f"approval {approval_id!r} is already {approval.status}", "approval_decided")
    run = db.get(Run, approval.run_id)
    if turn is None or run is None or turn.status != TurnStatus.AWAITING_APPROVAL:
        raise Conflict(f"the turn of approval {approval_id!r} is not waiting for a decision", "approval_stale")
    claim = (update(Approval).where(col(Approval.id) == approval_id, col(Approval.status) == ApprovalStatus.PENDING)
             .values(status=ApprovalStatus.APPROVED if approved else ApprovalStatus.REJECTED, comment=comment,
                     decided_at=utcnow(), decided_by=decided_by))
    claimed = cast(CursorResult, db.execute(claim))
    if claimed.rowcount != 1:
        db.rollback()
        raise Conflict(f"approval {approval_id!r} was decided meanwhile", "approval_decided")
    return turn, run


def lock_turn(db: Session, turn_id: str) -> Turn:
    """Turn `turn_id` as it is now, its row locked until the transaction ends: PostgreSQL's
    FOR NO KEY UPDATE, so a transition of the turn in another process waits, then reads what
    this one wrote, while rows that only refer to the turn (its journal, its spans) are still
    written. Every transition takes it before it touches the turn's runs or approvals: one
    order, no deadlock. SQLite has one writer at a time (and each process its own lock,
    app/services/turns.py). NotFound for an unknown turn."""
    turn = db.exec(select(Turn).where(Turn.id == turn_id).with_for_update(key_share=True)
                   .execution_options(populate_existing=True)).first()
    if turn is None:
        raise NotFound(f"unknown turn {turn_id!r}", "unknown_turn")
    return turn


def lock_branch(db: Session, branch: Branch) -> Branch:
    """`branch` as it is now, its row locked until the transaction ends (FOR NO KEY UPDATE on
    PostgreSQL): a turn that completes meanwhile (its end and the branch's new head are one
    transaction) is either seen completed with its head, or waits until this one has
    recorded its new turn. Refreshed again after the check that the branch is free, for SQLite,
    whose reads outside a write see each statement's own moment."""
    locked = db.exec(select(Branch).where(Branch.id == branch.id).with_for_update(key_share=True)
                     .execution_options(populate_existing=True)).first()
    if locked is None:
        raise NotFound(f"unknown branch {branch.id!r}", "unknown_branch")
    return locked


def resume(db: Session, turn: Turn, run: Run, owner: str | None) -> None:
    """awaiting_approval → running, run by process `owner` from now on."""
    _move(db, TurnStatus.RUNNING, turn, run)
    run.owner = owner


def complete(db: Session, turn: Turn, run: Run, values: dict, end_checkpoint_id: str) -> dict:
    """running → completed with the graph's final `values`: the messages the turn added, its
    answer and outcome; its branch's head moves to it and its files are published. Returns
    the `final` event."""
    start = RunOptions.of(run).history_len or 0
    turn.messages = branch_threads.openai_messages(values["messages"][start:])
    turn.end_checkpoint_id = end_checkpoint_id
    turn.final_answer = values.get("final_answer") or ""
    turn.outcome = values.get("outcome")
    _move(db, TurnStatus.COMPLETED, turn, run)
    turn.finished_at = run.ended_at = utcnow()
    branch = _branch(db, turn)
    branch.head_turn_id = turn.id
    db.add(branch)
    workspace.publish(db, turn)
    return {"type": "final", "turn_id": turn.id, "branch_id": turn.branch_id, "content": turn.final_answer,
            "outcome": turn.outcome, "steps": values.get("steps", 0)}


def fail(db: Session, turn: Turn, run: Run, message: str) -> None:
    """running → failed (`message` says why); its staged files are deleted."""
    end(db, TurnStatus.FAILED, message, turn, run)
    workspace.discard(db, turn)


def cancel(db: Session, turn: Turn, run: Run, message: str) -> None:
    """running → cancelled (stopped by the user); its staged files are deleted."""
    end(db, TurnStatus.CANCELLED, message, turn, run)
    workspace.discard(db, turn)


def cancel_here(db: Session, turn: Turn, message: str) -> None:
    """Cancel a turn no process runs (paused, or its process died): its active runs and
    pending approvals with it, and its `cancelled` event journaled for its followers."""
    now = utcnow()
    for approval in _pending_approvals(db, turn.id):
        approval.status, approval.comment, approval.decided_at = ApprovalStatus.CANCELLED, message, now
        db.add(approval)
    end(db, TurnStatus.CANCELLED, message, turn, *_active_runs(db, turn.id))
    workspace.discard(db, turn)  # a paused turn may have written files on an earlier approval
    append_event(db, turn, {"type": "cancelled", "turn_id": turn.id, "message": message})


def expire(db: Session, turn: Turn, message: str) -> None:
    """A paused turn whose pause is gone (no checkpoint holds its interrupt) → failed; its
    paused runs with it, its pending approvals `expired`."""
    now = utcnow()
    for approval in _pending_approvals(db, turn.id):
        approval.status, approval.comment, approval.decided_at = ApprovalStatus.EXPIRED, message, now
        db.add(approval)
    end(db, TurnStatus.FAILED, message, turn,
        *db.exec(select(Run).where(Run.turn_id == turn.id, Run.status == TurnStatus.AWAITING_APPROVAL)).all())
    workspace.discard(db, turn)


def request_cancel(db: Session, run: Run) -> None:
    """Ask the process running `run` to cancel it (app/services/remote_cancel.py); no state moves."""
    run.cancel_requested_at = utcnow()
    db.add(run)


def end(db: Session, status: TurnStatus, message: str, *rows: Turn | Run) -> None:
    """Turns and runs that ended without an outcome (failed or cancelled): status, error, end time."""
    now: datetime = utcnow()
    for row in rows:
        row.status, row.error = status, message
        if isinstance(row, Turn):
            row.finished_at = now
        else:
            row.ended_at = now
        db.add(row)


def _active_runs(db: Session, turn_id: str) -> list[Run]:
    return list(db.exec(select(Run).where(Run.turn_id == turn_id, col(Run.status).in_(ACTIVE_TURN_STATES))).all())


def _pending_approvals(db: Session, turn_id: str) -> list[Approval]:
    return list(db.exec(select(Approval).where(Approval.turn_id == turn_id,
                                               Approval.status == ApprovalStatus.PENDING)).all())


def _branch(db: Session, turn: Turn) -> Branch:
    branch = db.get(Branch, turn.branch_id)
    assert branch is not None  # a turn's branch goes with it
    return branch


def _move(db: Session, status: TurnStatus, turn: Turn, run: Run) -> None:
    turn.status = run.status = status
    _add(db, turn, run)


def _add(db: Session, *rows: Turn | Run) -> None:
    for row in rows:
        db.add(row)
