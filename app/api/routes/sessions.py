"""Sessions, their branches (fork / switch), branch history and the request preview."""

from __future__ import annotations

import asyncio
from typing import Any

from fastapi import APIRouter, Response
from pydantic import BaseModel, Field
from sqlmodel import Session, col, select

from app.agent.cache_hints import hint_key
from app.agent.model_client import ModelBackendError
from app.agent.requests import fitted_step_body
from app.api.deps import AgentSessionDep, CatalogDep, DbDep, TurnServiceDep, WorkbenchDep
from app.db.models import (
    AgentSession,
    Branch,
    BranchCreate,
    BranchPublic,
    SessionCreate,
    SessionDetail,
    SessionPublic,
    TurnPublic,
    WorkspaceFilePublic,
)
from app.errors import WorkbenchError
from app.services import sessions as sessions_service
from app.services import workspace as workspace_service

router = APIRouter(prefix="/sessions", tags=["sessions"])


class SessionUpdate(BaseModel):
    title: str | None = Field(default=None, max_length=200)
    active_branch_id: str | None = None


class PreviewRequest(BaseModel):
    message: str
    branch_id: str | None = None
    force_tool: bool = False
    tool_choice: str | dict | None = None


@router.post("", status_code=201)
def create_session(request: SessionCreate, db: DbDep, catalog: CatalogDep) -> SessionDetail:
    catalog.get(request.scenario)
    session = sessions_service.create_session(db, request.scenario, request.title)
    return sessions_service.session_detail(db, session)


@router.get("")
def list_sessions(db: DbDep, scenario: str | None = None) -> list[SessionPublic]:
    query = select(AgentSession).order_by(col(AgentSession.created_at).desc())
    if scenario:
        query = query.where(AgentSession.scenario == scenario)
    return [SessionPublic.model_validate(s) for s in db.exec(query).all()]


@router.get("/{session_id}")
def get_session(session: AgentSessionDep, db: DbDep) -> SessionDetail:
    return sessions_service.session_detail(db, session)


@router.patch("/{session_id}")
def update_session(request: SessionUpdate, session: AgentSessionDep, db: DbDep) -> SessionDetail:
    """Rename, or switch the active branch (cheap: only a pointer moves)."""
    if request.active_branch_id is not None:
        session = sessions_service.activate_branch(db, session, request.active_branch_id)
    if request.title is not None:
        session.title = request.title
        db.add(session)
        db.commit()
        db.refresh(session)
    return sessions_service.session_detail(db, session)


@router.delete("/{session_id}", status_code=204)
async def delete_session(session: AgentSessionDep, db: DbDep, workbench: WorkbenchDep) -> Response:
    """Delete the session, its turns, branches, traces and approvals, and its graph checkpoints;
    the inference server is told its branches are done (a release)."""
    keys = await asyncio.to_thread(_branch_keys, db, session)
    await workbench.delete_session(db, session)
    await workbench.turns.hints.release(keys)
    return Response(status_code=204)


def _branch_keys(db: Session, session: AgentSession) -> list[str]:
    branches = db.exec(select(Branch.id).where(Branch.session_id == session.id)).all()
    return [hint_key(session.id, branch_id) for branch_id in branches]


@router.post("/{session_id}/branches", status_code=201)
async def fork_branch(request: BranchCreate, session: AgentSessionDep, workbench: WorkbenchDep) -> BranchPublic:
    """Fork a branch: from the end of `turn_id` (its history up to and including that turn), or
    from `checkpoint_id` inside turn `turn_id` (its first turn then continues that turn: POST
    .../branches/{id}/continue), or empty (neither); it becomes active."""
    branch = await workbench.branches.fork(session.id, request)
    return BranchPublic.model_validate(branch)


@router.get("/{session_id}/branches/{branch_id}/checkpoints")
async def branch_checkpoints(branch_id: str, session: AgentSessionDep, workbench: WorkbenchDep) -> list[dict]:
    """The checkpoints of the branch's LangGraph thread a fork can start from, newest first:
    id, turn, step, what runs next, message count and the last message."""
    return await workbench.branches.checkpoints(session.id, branch_id)


@router.delete("/{session_id}/branches/{branch_id}", status_code=204)
async def delete_branch(branch_id: str, session: AgentSessionDep, workbench: WorkbenchDep) -> Response:
    """Delete the branch, its turns, traces, approvals, files and checkpoint thread; the inference server
    is told it is done. 409 for the main branch, a branch with a running turn, or one that other
    branches fork from."""
    await workbench.branches.delete(session.id, branch_id)
    return Response(status_code=204)


@router.get("/{session_id}/branches/{branch_id}/files")
async def branch_files(branch_id: str, session: AgentSessionDep, db: DbDep,
                       content: bool = False) -> list[WorkspaceFilePublic]:
    """The files the branch's tools wrote (approved story chapters, ...), in path order; their
    text with `?content=true`. A fork has its parent's files at the fork point, then its own."""
    def files() -> list[WorkspaceFilePublic]:
        branch = sessions_service.get_branch(db, session, branch_id)
        return workspace_service.list_files(db, branch.id, with_content=content)
    return await asyncio.to_thread(files)


@router.post("/{session_id}/branches/{branch_id}/open", status_code=204)
async def open_branch(branch_id: str, session: AgentSessionDep, db: DbDep, turns: TurnServiceDep) -> Response:
    """The user opened this branch (the session page shows it): the workbench pins its cache on
    the inference server and unpins the branch it pinned before. Nothing changes in the database."""
    branch = await asyncio.to_thread(sessions_service.get_branch, db, session, branch_id)
    await turns.hints.open_branch(hint_key(session.id, branch.id))
    return Response(status_code=204)


@router.get("/{session_id}/branches/{branch_id}")
async def branch_history(branch_id: str, session: AgentSessionDep, db: DbDep, turns: TurnServiceDep) -> dict:
    """The branch, the turns on its path (root first) and the conversation its next turn starts
    from (its thread's state)."""
    branch, messages = await turns.conversation(session.id, branch_id)
    path = await asyncio.to_thread(sessions_service.path_to, db, branch.head_turn_id)
    return {"branch": BranchPublic.model_validate(branch).model_dump(mode="json"),
            "turns": [TurnPublic.model_validate(t).model_dump(mode="json") for t in path],
            "messages": messages}


@router.post("/{session_id}/preview")
async def preview_request(request: PreviewRequest, session: AgentSessionDep, db: DbDep, catalog: CatalogDep,
                          turns: TurnServiceDep, workbench: WorkbenchDep) -> dict[str, Any]:
    """The exact body and headers the first model step of this message would send (nothing is sent)."""
    message = turns.validate_message(request.message)
    scenario = catalog.get(session.scenario)
    branch, past, context = await turns.next_start(session.id, request.branch_id)
    warnings = []
    try:
        model = await workbench.adapter.model_name()
    except ModelBackendError as exc:
        model = workbench.settings.llm_model or "<first model of GET /models>"
        warnings.append(f"model name not resolved: {exc}")
    try:
        body, fitted = await fitted_step_body(
            workbench.budget, workbench.adapter, scenario, model, [*past, {"role": "user", "content": message}],
            len(past), context, step=1, max_steps=workbench.settings.step_budget, force_tool=request.force_tool,
            tool_choice=request.tool_choice, cache_session=hint_key(session.id, branch.id),
            compact_tools=workbench.settings.compact_tool_schemas)
    except ModelBackendError as exc:  # the message alone does not fit the context
        raise WorkbenchError(str(exc), "context_exceeded", 422) from None
    if fitted.compacted:
        done = fitted.compaction
        assert done is not None  # compacted
        warnings.append(f"the history is compacted to fit the model's context: about {done.tokens_before} -> "
                        f"{done.tokens_after} tokens, {done.reduced_turns} turn(s) reduced, "
                        f"{done.dropped_turns} dropped")
    return {"url": f"{workbench.settings.llm_base_url}/chat/completions", "body": body,
            "headers": workbench.adapter.hint_headers(body), "branch_id": branch.id,
            "prompt_chars": sum(len(str(m.get("content") or "")) for m in body["messages"]),
            "warnings": warnings}

