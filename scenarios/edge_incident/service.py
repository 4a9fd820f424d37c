"""The simulated edge event service: a small FastAPI app whose answers depend on --state.

    python -m scenarios.edge_incident.service --state degraded --host 127.0.0.1 --port 8765

Routes: GET /health (503 when failed), /status, /metrics, /logs (filters: level = minimum
level, component, contains, since_minutes, limit; newest first), /dependencies. The state
is fixed for the life of the process; the data comes from world.py and never changes, so
the agent sees the same incident every time. It performs no action: nothing here restarts
or rolls back anything.
"""

from __future__ import annotations

import argparse
import os
from typing import Literal

from fastapi import FastAPI, Query
from fastapi.responses import JSONResponse

from scenarios.edge_incident import world
from scenarios.edge_incident.world import STATES, State

DEFAULT_PORT = 8765


def create_app(state: State) -> FastAPI:
    """The service in `state` (healthy | degraded | failed)."""
    if state not in STATES:
        raise ValueError(f"unknown state {state!r}; choose one of {', '.join(STATES)}")
    app = FastAPI(title=f"{world.SERVICE} (simulated, {state})")

    @app.get("/health")
    def health() -> JSONResponse:
        body = world.health(state)
        return JSONResponse(body, status_code=503 if state == "failed" else 200)

    @app.get("/status")
    def status() -> dict:
        return world.status(state)

    @app.get("/metrics")
    def metrics() -> dict:
        return world.metrics(state)

    @app.get("/dependencies")
    def dependencies() -> dict:
        return world.dependencies(state)

    @app.get("/logs")
    def logs(
        level: Literal["debug", "info", "warning", "error", "critical"] | None = None,
        component: str | None = None,
        contains: str | None = None,
        since_minutes: int | None = Query(default=None, ge=1, le=24 * 60),
        limit: int = Query(default=20, ge=1, le=200),
    ) -> dict:
        records = world.filter_logs(world.logs(state), level, component, contains, since_minutes)
        newest_first = records[::-1]
        return {"service": world.SERVICE, "total": len(records), "logs": newest_first[:limit]}

    return app


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="arbor-incident", description="Simulated edge event service.")
    parser.add_argument("--state", choices=STATES, default=os.environ.get("INCIDENT_STATE", "degraded"),
                        help="incident state (default: $INCIDENT_STATE or degraded)")
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=DEFAULT_PORT)
    return parser


def main(argv: list[str] | None = None) -> None:
    parser = _parser()
    args = parser.parse_args(argv)
    # argparse checks `choices` for given values only; a default from the environment is not.
    if args.state not in STATES:
        parser.error(f"INCIDENT_STATE={args.state!r} is not one of {', '.join(STATES)}")
    import uvicorn

    uvicorn.run(create_app(args.state), host=args.host, port=args.port, log_level="warning")


if __name__ == "__main__":
    main()
