"""The HTML pages of the workbench and the static files they load.

Pages (all GET, HTML):
  /                          Home: scenarios with their data sets, recent sessions, server status
  /sessions/{id}             Session: chat, tool cards, approvals, branch tree
  /sessions/{id}/trace       Trace: per-turn span timelines and token totals
  /cache                     Cache: the inference server's /cache/stats per tier, live
  /replay                    Replay: charts of replay results in <data dir>/replay/

Helper JSON for the pages (read-only):
  /ui/server/{cache-stats|props|slots}   the inference server's llama-server style endpoints,
                                         always HTTP 200 with {"available": bool, "reason", "data"};
                                         cache-stats passes ?measure=true on

The pages are thin shells: their scripts read the workbench API (/api/...) and render with
DOM methods only (text nodes, never innerHTML of data), so no model answer or tool result can
run a script. A Content-Security-Policy without 'unsafe-inline' backs that up.

The app serves the frontend (`install`); the frontend never imports the app. What a page
needs from it comes through ``app.state``: ``settings`` (llm_base_url, llm_api_key, data_dir),
``workbench`` (its scenario catalog) and the replay-runs loader handed to `install`.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

from fastapi import APIRouter, FastAPI, Request
from fastapi.responses import HTMLResponse, JSONResponse
from fastapi.staticfiles import StaticFiles
from fastapi.templating import Jinja2Templates

from frontend.server_proxy import ENDPOINTS, lookup, passed_params

HERE = Path(__file__).parent
templates = Jinja2Templates(directory=str(HERE / "templates"))

#: scripts and styles only from this origin; nothing inline, no plugins, no framing
CONTENT_SECURITY_POLICY = ("default-src 'self'; script-src 'self'; style-src 'self'; img-src 'self' data:; "
                           "connect-src 'self'; object-src 'none'; base-uri 'none'; form-action 'self'; "
                           "frame-ancestors 'none'")

router = APIRouter(include_in_schema=False)


def install(app: FastAPI, *, replay_runs: Callable[[Path], Any]) -> None:
    """Serve the pages and frontend/static/ at /static (name "static", for url_for in the
    templates). `replay_runs(data_dir)` lists the replay results for the Replay page (an object
    with ``runs``, ``unreadable`` and ``folder``)."""
    app.state.replay_runs = replay_runs
    app.include_router(router)
    app.mount("/static", StaticFiles(directory=str(HERE / "static")), name="static")


def _settings(request: Request) -> Any:
    return request.app.state.settings


def render_page(request: Request, template: str, active: str, **context: Any) -> HTMLResponse:
    response = templates.TemplateResponse(request, template, {"active": active, **context})
    response.headers["Content-Security-Policy"] = CONTENT_SECURITY_POLICY
    response.headers["X-Content-Type-Options"] = "nosniff"
    response.headers["Referrer-Policy"] = "same-origin"
    return response


def data_brief(data: Any) -> str:
    """One line about a data summary: list lengths and short scalars of its top level."""
    if not isinstance(data, dict):
        return ""
    parts = []
    for key, value in data.items():
        name = key.replace("_", " ")
        if isinstance(value, (list, tuple)):
            parts.append(f"{len(value)} {name}")
        elif isinstance(value, (int, float)) and not isinstance(value, bool):
            parts.append(f"{value} {name}")
        elif isinstance(value, str) and len(value) <= 40 and not value.startswith(("python ", "http")):
            parts.append(f"{name} {value}")
    return " · ".join(parts[:5])


def _scenario_cards(request: Request) -> list[dict]:
    workbench = getattr(request.app.state, "workbench", None)
    if workbench is None:
        return []
    cards = []
    for scenario in workbench.catalog.list():
        try:
            data, data_error = scenario.data_summary(), None
        except Exception as exc:  # noqa: BLE001  one broken data set must not take the home page down
            data, data_error = None, f"{type(exc).__name__}: {exc}"
        cards.append({
            "name": scenario.name, "title": scenario.title, "description": scenario.description,
            "starter_questions": list(scenario.starter_questions),
            "tools": [{"name": t.name, "requires_approval": bool(getattr(t, "requires_approval", False))}
                      for t in scenario.tools],
            "data": data, "data_error": data_error, "data_brief": data_brief(data),
        })
    return cards


@router.get("/", response_class=HTMLResponse)
def home(request: Request) -> HTMLResponse:
    settings = _settings(request)
    return render_page(request, "home.html", "home", scenarios=_scenario_cards(request),
                 llm_base_url=settings.llm_base_url)


@router.get("/sessions/{session_id}", response_class=HTMLResponse)
def session_page(request: Request, session_id: str) -> HTMLResponse:
    return render_page(request, "session.html", "session", session_id=session_id)


@router.get("/sessions/{session_id}/trace", response_class=HTMLResponse)
def trace_page(request: Request, session_id: str) -> HTMLResponse:
    return render_page(request, "trace.html", "trace", session_id=session_id)


@router.get("/cache", response_class=HTMLResponse)
def cache_page(request: Request) -> HTMLResponse:
    return render_page(request, "cache.html", "cache", llm_base_url=_settings(request).llm_base_url)


@router.get("/replay", response_class=HTMLResponse)
def replay_page(request: Request) -> HTMLResponse:
    found = request.app.state.replay_runs(_settings(request).data_dir)
    return render_page(request, "replay.html", "replay", runs=found.runs, unreadable=found.unreadable,
                 folder=str(found.folder))


@router.get("/ui/server/{endpoint}")
async def server_endpoint(request: Request, endpoint: str) -> JSONResponse:
    """One of the inference server's llama-server style endpoints, or why it is not available."""
    if endpoint not in ENDPOINTS:
        return JSONResponse({"error": {"message": f"unknown server endpoint {endpoint!r}; known: "
                                                  f"{', '.join(ENDPOINTS)}", "type": "not_found"}},
                            status_code=404)
    settings = _settings(request)
    api_key = settings.llm_api_key
    result = await lookup(settings.llm_base_url, endpoint, api_key if api_key and api_key != "not-needed" else None,
                          params=passed_params(endpoint, dict(request.query_params)))
    return JSONResponse(result.to_dict(), headers={"Cache-Control": "no-store"})
