"""The workbench FastAPI application: `create_app()` (used by `arbor serve` and the tests)."""

from __future__ import annotations

import sys
from contextlib import asynccontextmanager

from fastapi import APIRouter, FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from starlette.exceptions import HTTPException as StarletteHTTPException

from app.api.body_guard import BodyGuard
from app.api.routes import approvals, health, scenarios, sessions, traces, turns
from app.auth import signin
from app.auth.guard import WorkbenchGuard
from app.auth.operator_token import OperatorToken, resolve_token
from app.errors import WorkbenchError
from app.platform import routes as platform
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


def operator_token(settings: WorkbenchSettings) -> OperatorToken:
    """The operator token of this workbench (app/auth/operator_token.py); a token generated
    now is announced once, on stderr, with the URL that signs a browser in."""
    configured = settings.workbench_token.get_secret_value() if settings.workbench_token else None
    token = resolve_token(configured, settings.data_dir)
    if token.source == "generated":
        print(f"arbor: a workbench token was generated into {token.path} (mode 0600). Sign in at "
              f"{sign_in_url(settings, token)}", file=sys.stderr, flush=True)
    return token


def sign_in_url(settings: WorkbenchSettings, token: OperatorToken) -> str:
    host = "127.0.0.1" if settings.host in ("0.0.0.0", "::", "") else settings.host
    host = f"[{host}]" if ":" in host else host
    return f"http://{host}:{settings.port}/signin?token={token.value}"


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
    token = operator_token(settings)
    app.state.operator_token = token
    install_error_handlers(app)
    app.add_middleware(BodyGuard, max_message_chars=settings.max_message_chars)
    # Added last, so it runs first: nothing reads a body before the caller is known.
    app.add_middleware(WorkbenchGuard, token=token, allowed_hosts=settings.trusted_hosts,
                       identity_header=settings.identity_header, session_max_age_s=settings.session_max_age_s)
    app.include_router(api_router())
    app.include_router(platform.router)  # the LangGraph Platform API (app/platform/)
    app.include_router(health.open_router)
    app.include_router(signin.router)
    # -- web pages (frontend/): HTML routes and /static; the frontend never imports the app ----
    pages.install(app, replay_runs=load_replay_runs)
    return app
