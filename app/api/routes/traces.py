"""Traces (spans + token summary), full tool-result artifacts, and the request manifest."""

from __future__ import annotations

from fastapi import APIRouter
from fastapi.responses import Response

from app.api.deps import AgentSessionDep, DbDep
from app.db.models import ArtifactPublic
from app.services import traces as traces_service
from harness.manifest import dumps_manifest

router = APIRouter(tags=["traces"])


@router.get("/sessions/{session_id}/trace")
def get_trace(session: AgentSessionDep, db: DbDep, turn_id: str | None = None, branch_id: str | None = None,
              bodies: bool = True) -> dict:
    """Spans with a token summary; `bodies=false` leaves each span's request body out (null):
    what the pages load. GET /api/spans/{id} has one span's in full."""
    return traces_service.trace(db, session, turn_id, branch_id, bodies)


@router.get("/spans/{span_id}")
def get_span(span_id: str, db: DbDep) -> dict:
    """One span with its request body (a model call's exact request)."""
    return traces_service.span_public(db, span_id)


@router.get("/sessions/{session_id}/manifest")
def get_manifest(session: AgentSessionDep, db: DbDep, branch_id: str | None = None) -> Response:
    """JSONL, one line per answered model request (format: harness/manifest.py)."""
    text = dumps_manifest(traces_service.manifest_lines(db, session, branch_id))
    return Response(text, media_type="application/x-ndjson",
                    headers={"Content-Disposition": f'attachment; filename="arbor-{session.id}.jsonl"'})


@router.get("/artifacts/{artifact_id}")
def get_artifact(artifact_id: str, db: DbDep) -> ArtifactPublic:
    return ArtifactPublic.model_validate(traces_service.get_artifact(db, artifact_id))
