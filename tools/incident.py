"""Tools of the edge_incident scenario: read the simulated event service, propose actions.

The service is reached over HTTP at `ctx.incident_base_url` (from the workbench settings;
nowhere else). A service that is down, slow or answers garbage raises `ToolError` with a
readable message. `propose_action` requires approval: the workbench never calls it on the
model's word but asks the operator; its function only formats the proposal record, it acts
on nothing.
"""

from __future__ import annotations

from typing import Any

import httpx

from tools.base import Tool, ToolContext, ToolError, object_schema

ACTIONS = ("restart_service", "rollback_release", "scale_up", "clear_queue",
           "disable_feature_flag", "escalate")
LOG_LEVELS = ("debug", "info", "warning", "error", "critical")


async def _get(ctx: ToolContext, path: str, params: dict | None = None,
               ok_statuses: tuple[int, ...] = (200,)) -> tuple[int, Any]:
    """GET a JSON document; returns (status code, body). Failures become ToolError."""
    base = ctx.incident_base_url.rstrip("/")
    try:
        async with httpx.AsyncClient(base_url=base, timeout=ctx.http_timeout_s) as client:
            response = await client.get(path, params={k: v for k, v in (params or {}).items() if v is not None})
    except httpx.TimeoutException:
        raise ToolError(f"incident service at {base} did not answer {path} within "
                        f"{ctx.http_timeout_s:g} s") from None
    except httpx.HTTPError as problem:
        raise ToolError(f"incident service at {base} is unreachable ({type(problem).__name__}: "
                        f"{problem or 'no details'})") from None
    if response.status_code not in ok_statuses:
        raise ToolError(f"incident service {path} answered HTTP {response.status_code}: "
                        f"{response.text[:200]}")
    try:
        return response.status_code, response.json()
    except ValueError:
        raise ToolError(f"incident service {path} did not return JSON: {response.text[:200]!r}") from None


async def service_status(ctx: ToolContext) -> dict:
    # /health says 503 when the service has failed: that is evidence, not a tool failure.
    code, health = await _get(ctx, "/health", ok_statuses=(200, 503))
    _, status = await _get(ctx, "/status")
    return {"health": health.get("status"), "health_http_status": code, **status}


async def service_metrics(ctx: ToolContext) -> dict:
    return (await _get(ctx, "/metrics"))[1]


async def service_logs(ctx: ToolContext, level: str | None = None, component: str | None = None,
                       contains: str | None = None, since_minutes: int | None = None,
                       limit: int = 20) -> dict:
    params = {"level": level, "component": component, "contains": contains,
              "since_minutes": since_minutes, "limit": limit}
    return (await _get(ctx, "/logs", params))[1]


async def service_dependencies(ctx: ToolContext) -> dict:
    return (await _get(ctx, "/dependencies"))[1]


def propose_action(ctx: ToolContext, action: str, target: str, reason: str) -> dict:
    """Format the proposal; executing it is the operator's business, never the agent's."""
    return {"proposal": {"action": action, "target": target, "reason": reason},
            "status": "awaiting_operator_approval", "executed": False}


INCIDENT_TOOLS: tuple[Tool, ...] = (
    Tool("service_status", "Health, release version and runtime of the event service.",
         object_schema({}), service_status),
    Tool("service_metrics", "Current metrics and the last hour's trend.",
         object_schema({}), service_metrics),
    Tool("service_logs", "Service logs, newest first; filters are optional.",
         object_schema({"level": {"type": "string", "enum": list(LOG_LEVELS), "description": "minimum level"},
                        "component": {"type": "string"}, "contains": {"type": "string"},
                        "since_minutes": {"type": "integer", "minimum": 1, "maximum": 1440},
                        "limit": {"type": "integer", "minimum": 1, "maximum": 200}}),
         service_logs),
    Tool("service_dependencies", "Health of the service's dependencies.",
         object_schema({}), service_dependencies),
    Tool("propose_action", "Propose a remediation; an operator must approve it, it is not executed.",
         object_schema({"action": {"type": "string", "enum": list(ACTIONS)},
                        "target": {"type": "string", "description": "e.g. edge-event-api or redis"},
                        "reason": {"type": "string"}},
                       ["action", "target", "reason"]),
         propose_action, requires_approval=True),
)
