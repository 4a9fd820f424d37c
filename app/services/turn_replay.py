"""The events of a turn that no task of this process is running, told from its rows.

A running turn's events are in its live log (app/services/turn_log.py). Once it has stopped
(or after a restart) the log is gone, and what a rejoining reader needs is how the turn
stands: its first event (`turn`) and its terminal one (`final`, `error`, `cancelled`, or the
`approval_request` it waits on). Its steps are in the turn itself (`GET /api/turns/{id}`:
messages) and its trace; they are not told again here.
"""

from __future__ import annotations

from sqlmodel import Session, col, select

from app.db.models import Approval, Run, Turn
from app.errors import Conflict


def recorded_events(db: Session, turn: Turn) -> list[dict]:
    """`turn`'s first and terminal events as its rows hold them. Conflict (`turn_elsewhere`)
    for a turn recorded `running` that this process does not run: another workbench process
    on the same database runs it, and only that one can stream it."""
    run = db.exec(select(Run).where(Run.turn_id == turn.id).order_by(col(Run.started_at).desc())).first()
    first = {"type": "turn", "turn_id": turn.id, "run_id": run.id if run else None, "session_id": turn.session_id,
             "branch_id": turn.branch_id, "parent_turn_id": turn.parent_turn_id, "resumed": False,
             "retry_of": ((run.options if run else None) or {}).get("retry_of"), "replayed": True}
    if turn.status == "running":
        raise Conflict(f"turn {turn.id!r} is running in another workbench process; its events stream there",
                       "turn_elsewhere")
    return [first, _terminal(db, turn)]


def _terminal(db: Session, turn: Turn) -> dict:
    if turn.status == "completed":
        steps = sum(1 for m in turn.messages or [] if m.get("role") == "assistant")
        return {"type": "final", "turn_id": turn.id, "branch_id": turn.branch_id, "content": turn.final_answer or "",
                "outcome": turn.outcome, "steps": steps}
    if turn.status == "cancelled":
        return {"type": "cancelled", "turn_id": turn.id, "message": turn.error or "stopped by the user"}
    if turn.status == "awaiting_approval":
        approval = db.exec(select(Approval).where(Approval.turn_id == turn.id, Approval.status == "pending")
                           .order_by(col(Approval.created_at))).first()
        if approval is not None:
            return {"type": "approval_request", "approval_id": approval.id, "turn_id": turn.id,
                    "tool_call_id": approval.tool_call_id, "tool_name": approval.tool_name,
                    "arguments": approval.arguments}
    return {"type": "error", "turn_id": turn.id, "message": turn.error or f"the turn is {turn.status}",
            "error_type": "failed", "retryable": turn.status == "failed"}
