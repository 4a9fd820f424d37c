"""The workbench FastAPI application: `create_app()` (used by `arbor serve` and the tests)."""

from __future__ import annotations

from contextlib import asynccontextmanager

from fastapi import APIRouter, FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from starlette.exceptions import HTTPException as StarletteHTTPException

from app.api.body_guard import BodyGuard
from app.api.routes import approvals, health, scenarios, sessions, traces, turns
from app.errors import WorkbenchError
from app.replay.run_files import load_replay_runs
from app.scenario_catalog import ScenarioCatalog
from app.settings import WorkbenchSettings, get_settings
from app.workbench import Workbench
from frontend import pages


def _error(status: int, message: str, error_type: str) -> JSONResponse:
    return JSONResponse(status_code=status, content={"error": {"message": message, "type": error_type}})


def _validation_message(exc: RequestValidationError) -> str:
    parts = []
    for problem in exc.errors():
        where = ".".join(str(p) for p in problem.get("loc", ()) if p != "body") or "body"
        parts.append(f"{where}: {problem.get('msg')}")
    return "; ".join(parts) or "invalid request"


def install_error_handlers(app: FastAPI) -> None:
    @app.exception_handler(WorkbenchError)
    async def _workbench_error(_: Request, exc: WorkbenchError) -> JSONResponse:
        return JSONResponse(status_code=exc.status_code, content=exc.to_body())

    @app.exception_handler(RequestValidationError)
    async def _invalid(_: Request, exc: RequestValidationError) -> JSONResponse:
        return _error(422, _validation_message(exc), "invalid_request")

    @app.exception_handler(StarletteHTTPException)
    async def _http(_: Request, exc: StarletteHTTPException) -> JSONResponse:
        error_type = {404: "not_found", 405: "method_not_allowed"}.get(exc.status_code, "http_error")
        return _error(exc.status_code, str(exc.detail), error_type)


def api_router() -> APIRouter:
    router = APIRouter(prefix="/api")
    for module in (health, scenarios, sessions, turns, approvals, traces):
        router.include_router(module.router)
    return router


def create_app(settings: WorkbenchSettings | None = None, catalog: ScenarioCatalog | None = None) -> FastAPI:
    """The app; `settings` default to the environment, `catalog` to scenarios.registry."""
    settings = settings or get_settings()

    @asynccontextmanager
    async def lifespan(app: FastAPI):
        workbench = await Workbench.open(settings, catalog)
        app.state.workbench = workbench
        try:
            yield
        finally:
            await workbench.close()

    app = FastAPI(title="Arbor workbench", version="0.1.0", lifespan=lifespan)
    app.state.settings = settings
    install_error_handlers(app)
    app.add_middleware(BodyGuard, max_message_chars=settings.max_message_chars)
    app.include_router(api_router())
    # -- web pages (frontend/): HTML routes and /static; the frontend never imports the app ----
    pages.install(app, replay_runs=load_replay_runs)
    return app
