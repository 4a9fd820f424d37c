"""Proposed actions waiting for the operator; a decision resumes the paused run."""

from __future__ import annotations

from fastapi import APIRouter, Request
from sqlmodel import col, select

from app.api.deps import DbDep, TurnServiceDep
from app.api.streaming import collected, event_stream
from app.db.models import Approval, ApprovalDecision, ApprovalPublic, ApprovalStatus
from app.errors import NotFound

router = APIRouter(prefix="/approvals", tags=["approvals"])


@router.get("")
def list_approvals(db: DbDep, status: str | None = ApprovalStatus.PENDING,
                   session_id: str | None = None) -> list[ApprovalPublic]:
    query = select(Approval).order_by(col(Approval.created_at))
    if status:
        query = query.where(Approval.status == status)
    if session_id:
        query = query.where(Approval.session_id == session_id)
    return [ApprovalPublic.model_validate(a) for a in db.exec(query).all()]


@router.get("/{approval_id}")
def get_approval(approval_id: str, db: DbDep) -> ApprovalPublic:
    approval = db.get(Approval, approval_id)
    if approval is None:
        raise NotFound(f"unknown approval {approval_id!r}", "unknown_approval")
    return ApprovalPublic.model_validate(approval)


@router.post("/{approval_id}")
async def decide(approval_id: str, decision: ApprovalDecision, turns: TurnServiceDep, request: Request):
    """Approve or reject; the run resumes and its remaining events stream like a turn's. Who
    decided (the signed-in operator, app/auth/guard.py) is recorded with the decision."""
    handle = await turns.decide(approval_id, decision.approved, decision.comment,
                                getattr(request.state, "operator", None))
    if decision.stream:
        return event_stream(handle)
    return await collected(handle, turns)
