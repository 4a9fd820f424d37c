"""GET /api/health: the workbench, its database and the model backend (signed in); GET /healthz:
alive, for probes that hold no token."""

from __future__ import annotations

import asyncio

import openai
from fastapi import APIRouter
from sqlalchemy import text

from app.api.deps import DbDep, WorkbenchDep

router = APIRouter(tags=["health"])
#: served without sign-in (compose's healthcheck): says the process answers, and nothing else
open_router = APIRouter(include_in_schema=False)

_PROBE_TIMEOUT_S = 3.0


@open_router.get("/healthz")
def alive() -> dict:
    return {"status": "ok"}


@router.get("/health")
async def health(workbench: WorkbenchDep, db: DbDep) -> dict:
    """status "ok" when the model backend answers GET /models, "degraded" otherwise (still HTTP 200:
    the workbench itself is up; turns fail with a readable error until the backend is back)."""
    settings = workbench.settings
    await asyncio.to_thread(db.execute, text("SELECT 1"))  # off the event loop, like every database call
    llm: dict = {"base_url": settings.llm_base_url, "configured_model": settings.llm_model or None,
                 "reachable": False, "models": [], "error": None}
    try:
        client = workbench.adapter.client.with_options(timeout=min(_PROBE_TIMEOUT_S, settings.llm_timeout_s))
        page = await client.models.list()
        llm["models"] = [m.id for m in page.data]
        llm["reachable"] = True
    except openai.OpenAIError as exc:
        llm["error"] = workbench.adapter._translate(exc).args[0]
    return {"status": "ok" if llm["reachable"] else "degraded", "database": "ok", "llm": llm,
            "scenarios": [s.name for s in workbench.catalog.list()],
            "incident_base_url": settings.incident_base_url,
            # OTLP export (app/telemetry/otlp.py): spans exported, dropped (queue full or collector
            # unreachable), queued; null when off
            "otlp": workbench.telemetry.stats() if workbench.telemetry is not None else None}
