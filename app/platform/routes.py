"""The LangGraph Platform API's routes, under `/langgraph` (point `langgraph_sdk.get_client(url=
"http://HOST:8090/langgraph", api_key=<workbench token>)` or agent-chat-ui's deployment URL there).

Behind the workbench's sign-in like every route: the SDK's `x-api-key` header, or
`Authorization: Bearer`, carries the operator token (app/auth/guard.py).

    GET  /info, /ok
    POST /assistants/search, /assistants/count;  GET /assistants/{id}, .../schemas, .../graph, .../subgraphs
    POST /threads, /threads/search, /threads/count
    GET  /threads/{id};  DELETE /threads/{id};  POST /threads/{id}/copy
    GET  /threads/{id}/state[/{checkpoint_id}];  POST /threads/{id}/state/checkpoint;  POST|GET /threads/{id}/history
    POST /threads/{id}/runs, .../runs/stream, .../runs/wait;  GET /threads/{id}/runs
    GET  /threads/{id}/runs/{run_id}, .../join, .../stream;  POST .../cancel
    POST /runs, /runs/stream, /runs/wait (each on a new thread)

threads.py and runs.py say what each maps to.
"""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import AsyncIterator

from fastapi import APIRouter, Request, Response
from fastapi.responses import JSONResponse
from pydantic import BaseModel, ConfigDict
from sse_starlette.sse import EventSourceResponse

from app.errors import Conflict, WorkbenchError
from app.platform import wire
from app.platform.runs import RunRequest, Runs, StartedRun
from app.platform.stream import SUPPORTED_MODES
from app.platform.threads import Threads
from app.services.turn_log import TurnHandle
from app.services.turn_replay import RecordedTurn
from app.workbench import Workbench

log = logging.getLogger(__name__)

PREFIX = "/langgraph"
router = APIRouter(prefix=PREFIX, tags=["langgraph"])


def _api(request: Request) -> tuple[Threads, Runs]:
    workbench: Workbench = request.app.state.workbench
    api = getattr(request.app.state, "platform", None)
    if api is None or api[0].workbench is not workbench:  # one per running workbench, made on first use
        threads = Threads(workbench)
        api = request.app.state.platform = (threads, Runs(threads))
    return api


def _location(thread_id: str, run_id: str) -> dict[str, str]:
    return {"Content-Location": f"{PREFIX}/threads/{thread_id}/runs/{run_id}"}


class Search(BaseModel):
    model_config = ConfigDict(extra="ignore")
    metadata: dict | None = None
    graph_id: str | None = None
    name: str | None = None
    ids: list[str] | None = None
    status: str | None = None
    limit: int = 10
    offset: int = 0
    sort_order: str | None = None


class ThreadCreate(BaseModel):
    model_config = ConfigDict(extra="ignore")
    thread_id: str | None = None
    metadata: dict | None = None
    graph_id: str | None = None
    if_exists: str | None = None


class HistoryRequest(BaseModel):
    model_config = ConfigDict(extra="ignore")
    limit: int = 10
    before: str | dict | None = None
    metadata: dict | None = None
    checkpoint: dict | None = None


class CheckpointRequest(BaseModel):
    model_config = ConfigDict(extra="ignore")
    checkpoint: dict


# -- the server --------------------------------------------------------------------------------
@router.get("/info")
def info() -> dict:
    return {"version": wire.PLATFORM_VERSION, "server": "arbor-workbench",
            "flags": {"assistants": True, "crons": False, "langsmith": False, "store": False},
            "stream_modes": list(SUPPORTED_MODES)}


@router.get("/ok")
def ok() -> dict:
    return {"ok": True}


# -- assistants --------------------------------------------------------------------------------
@router.post("/assistants/search")
def search_assistants(body: Search, request: Request) -> list[dict]:
    threads, _ = _api(request)
    found = [a for a in threads.assistants()
             if (body.graph_id is None or a["graph_id"] == body.graph_id)
             and (body.name is None or body.name.lower() in a["name"].lower())
             and all((a["metadata"] or {}).get(k) == v for k, v in (body.metadata or {}).items())]
    return [dict(a) for a in found[body.offset:body.offset + max(1, body.limit)]]


@router.post("/assistants/count")
def count_assistants(body: Search, request: Request) -> int:
    return len(search_assistants(body.model_copy(update={"limit": 10_000, "offset": 0}), request))


@router.get("/assistants/{assistant_id}")
def get_assistant(assistant_id: str, request: Request) -> dict:
    threads, _ = _api(request)
    scenario = threads.scenario(assistant_id)
    return dict(wire.assistant(scenario, threads.started))


@router.get("/assistants/{assistant_id}/schemas")
def assistant_schemas(assistant_id: str, request: Request) -> dict:
    """What a run takes (input: one user message; context: the turn's options) and what the
    thread's state holds (app/agent/state.py's AgentState)."""
    threads, _ = _api(request)
    scenario = threads.scenario(assistant_id)
    return {"graph_id": scenario.name, "input_schema": INPUT_SCHEMA, "output_schema": STATE_SCHEMA,
            "state_schema": STATE_SCHEMA, "config_schema": None, "context_schema": CONTEXT_SCHEMA}


_MESSAGE = {"type": "object", "description": "a langchain-core message (type, content, id, tool_calls, ...)",
            "properties": {"type": {"type": "string"}, "content": {}}, "required": ["type", "content"]}
INPUT_SCHEMA = {"title": "ArborTurnInput", "type": "object", "required": ["messages"], "properties": {
    "messages": {"type": "array", "minItems": 1, "maxItems": 1, "description": "the turn's one user message",
                 "items": {"type": "object", "properties": {"role": {"enum": ["user", "human"]},
                                                            "type": {"enum": ["user", "human"]},
                                                            "content": {}}, "required": ["content"]}}}}
STATE_SCHEMA = {"title": "AgentState", "type": "object", "properties": {
    "messages": {"type": "array", "items": _MESSAGE, "description": "the conversation, without the system prompt"},
    "steps": {"type": "integer", "description": "model calls made in this turn"},
    "max_steps": {"type": "integer", "description": "the step budget of this turn"},
    "awaiting": {"type": "array", "items": {"type": "string"},
                 "description": "tool-call ids of the last model message that need the operator"},
    "decisions": {"type": "object", "description": "tool-call id -> {approved, comment}"},
    "final_answer": {"type": ["string", "null"]},
    "outcome": {"type": ["string", "null"],
                "enum": ["answered", "budget_exhausted", "tool_call_cut", "no_tool_call", "context_full", None]},
    "context_fit": {"type": "object", "description": "the branch's compaction level and token estimate"}}}
CONTEXT_SCHEMA = {"title": "ArborRunOptions", "type": "object", "properties": {
    "force_tool": {"type": "boolean", "default": False,
                   "description": "the first model step must call a tool (tool_choice required)"},
    "tool_choice": {"description": 'the first step\'s tool_choice: "auto", "required", "none" or '
                                   '{"type": "function", "function": {"name": ...}}'}}}


@router.get("/assistants/{assistant_id}/graph")
def assistant_graph(assistant_id: str, request: Request) -> dict:
    threads, _ = _api(request)
    threads.scenario(assistant_id)
    return threads.workbench.graph.get_graph().to_json()


@router.get("/assistants/{assistant_id}/subgraphs")
def assistant_subgraphs(assistant_id: str, request: Request) -> dict:
    threads, _ = _api(request)
    threads.scenario(assistant_id)
    return {}


# -- threads -----------------------------------------------------------------------------------
@router.post("/threads")
async def create_thread(body: ThreadCreate, request: Request) -> dict:
    threads, _ = _api(request)
    metadata = body.metadata or {}
    graph_id = body.graph_id or metadata.get("graph_id") or metadata.get("assistant_id")
    title = str(metadata.get("title") or metadata.get("name") or "")
    return dict(await threads.create(graph_id, body.thread_id, title, body.if_exists))


@router.post("/threads/search")
async def search_threads(body: Search, request: Request) -> list[dict]:
    threads, _ = _api(request)
    metadata = dict(body.metadata or {})
    if body.graph_id:
        metadata["graph_id"] = body.graph_id
    found = await threads.search(metadata=metadata, ids=body.ids, status=body.status, limit=body.limit,
                                 offset=body.offset, sort_order=body.sort_order or "desc")
    return [dict(t) for t in found]


@router.post("/threads/count")
async def count_threads(body: Search, request: Request) -> int:
    return len(await search_threads(body.model_copy(update={"limit": 1000, "offset": 0}), request))


@router.get("/threads/{thread_id}")
async def get_thread(thread_id: str, request: Request) -> dict:
    threads, _ = _api(request)
    return dict(await threads.thread(thread_id))


@router.delete("/threads/{thread_id}", status_code=204)
async def delete_thread(thread_id: str, request: Request) -> Response:
    threads, _ = _api(request)
    await threads.delete(thread_id)
    return Response(status_code=204)


@router.post("/threads/{thread_id}/copy")
async def copy_thread(thread_id: str, request: Request) -> dict:
    """A fork: a new branch (a new thread) from the thread's head."""
    threads, _ = _api(request)
    return dict(await threads.copy(thread_id))


@router.get("/threads/{thread_id}/state")
async def thread_state(thread_id: str, request: Request) -> dict:
    threads, _ = _api(request)
    return dict(await threads.state(thread_id))


@router.post("/threads/{thread_id}/state")
def update_thread_state(thread_id: str) -> dict:
    raise WorkbenchError("a thread's state changes only by its runs (turns); to go back, run from an earlier "
                         "checkpoint (a fork)", "state_update_not_served", 422)


@router.get("/threads/{thread_id}/state/{checkpoint_id}")
async def thread_state_at(thread_id: str, checkpoint_id: str, request: Request) -> dict:
    threads, _ = _api(request)
    return dict(await threads.state(thread_id, checkpoint_id))


@router.post("/threads/{thread_id}/state/checkpoint")
async def thread_state_at_checkpoint(thread_id: str, body: CheckpointRequest, request: Request) -> dict:
    threads, _ = _api(request)
    return dict(await threads.state(thread_id, body.checkpoint.get("checkpoint_id")))


@router.post("/threads/{thread_id}/history")
async def thread_history(thread_id: str, body: HistoryRequest, request: Request) -> list[dict]:
    threads, _ = _api(request)
    before = body.before.get("checkpoint_id") if isinstance(body.before, dict) else body.before
    return [dict(s) for s in await threads.history(thread_id, body.limit, before, body.metadata)]


@router.get("/threads/{thread_id}/history")
async def thread_history_get(thread_id: str, request: Request, limit: int = 10, before: str | None = None) -> list:
    threads, _ = _api(request)
    return [dict(s) for s in await threads.history(thread_id, limit, before)]


# -- runs --------------------------------------------------------------------------------------
@router.post("/threads/{thread_id}/runs/stream")
async def stream_run(thread_id: str, body: RunRequest, request: Request) -> EventSourceResponse:
    _, runs = _api(request)
    started = await runs.start(thread_id, body)
    return _sse(runs, started.handle, started.thread_id, started.graph_id, body.modes,
                cancel_on_disconnect=body.on_disconnect == "cancel")


@router.post("/runs/stream")
async def stream_stateless_run(body: RunRequest, request: Request) -> EventSourceResponse:
    _, runs = _api(request)
    started = await runs.start(None, body)
    return _sse(runs, started.handle, started.thread_id, started.graph_id, body.modes,
                cancel_on_disconnect=body.on_disconnect == "cancel")


@router.post("/threads/{thread_id}/runs/wait")
async def wait_run(thread_id: str, body: RunRequest, request: Request) -> JSONResponse:
    _, runs = _api(request)
    return await _wait(runs, await runs.start(thread_id, body))


@router.post("/runs/wait")
async def wait_stateless_run(body: RunRequest, request: Request) -> JSONResponse:
    _, runs = _api(request)
    return await _wait(runs, await runs.start(None, body))


@router.post("/threads/{thread_id}/runs")
async def create_run(thread_id: str, body: RunRequest, request: Request) -> JSONResponse:
    """A background run: answers the run at once; the turn goes on (join, stream or cancel it)."""
    _, runs = _api(request)
    return await _created(runs, await runs.start(thread_id, body))


@router.post("/runs")
async def create_stateless_run(body: RunRequest, request: Request) -> JSONResponse:
    _, runs = _api(request)
    return await _created(runs, await runs.start(None, body))


@router.get("/threads/{thread_id}/runs")
async def list_runs(thread_id: str, request: Request, limit: int = 10, offset: int = 0,
                    status: str | None = None) -> list:
    _, runs = _api(request)
    return [dict(r) for r in await asyncio.to_thread(runs.list, thread_id, limit, offset, status)]


@router.get("/threads/{thread_id}/runs/{run_id}")
async def get_run(thread_id: str, run_id: str, request: Request) -> dict:
    _, runs = _api(request)
    turn, graph_id = await asyncio.to_thread(runs.run, thread_id, run_id)
    return dict(wire.run(turn, graph_id))


@router.get("/threads/{thread_id}/runs/{run_id}/join")
async def join_run(thread_id: str, run_id: str, request: Request) -> JSONResponse:
    """Wait for the run to end (or pause) and answer the thread's values, as /wait does."""
    _, runs = _api(request)
    handle, _ = await runs.follow(thread_id, run_id)
    await handle.collect()
    return JSONResponse(await runs.end_values(run_id))


@router.get("/threads/{thread_id}/runs/{run_id}/stream")
async def join_run_stream(thread_id: str, run_id: str, request: Request, stream_mode: list[str] | None = None,
                          cancel_on_disconnect: bool = False) -> EventSourceResponse:
    """The run's stream from its (current segment's) start, then live, from any workbench process."""
    _, runs = _api(request)
    handle, graph_id = await runs.follow(thread_id, run_id)
    modes = stream_mode or list(request.query_params.getlist("stream_mode")) or ["values"]
    return _sse(runs, handle, thread_id, graph_id, modes, cancel_on_disconnect=cancel_on_disconnect, run_id=run_id)


@router.post("/threads/{thread_id}/runs/{run_id}/cancel")
async def cancel_run(thread_id: str, run_id: str, request: Request, wait: int = 0,
                     action: str = "interrupt") -> Response:
    """Stop the run (its model request is closed; the branch keeps its last completed turn, which
    is `rollback` and `interrupt` alike). 409 for a run that had already ended."""
    _, runs = _api(request)
    await runs.cancel(thread_id, run_id)
    return Response(status_code=204 if wait else 202)


# -- helpers -----------------------------------------------------------------------------------
def _sse(runs: Runs, handle: TurnHandle | RecordedTurn, thread_id: str, graph_id: str, modes: list[str], *,
         cancel_on_disconnect: bool, run_id: str | None = None) -> EventSourceResponse:
    run_id = run_id or handle.turn_id
    stream = runs.stream(run_id, thread_id, graph_id, modes)

    async def generate() -> AsyncIterator[dict]:
        try:
            async for name, data in stream.events(handle.events()):
                yield {"event": name, "data": json.dumps(data, ensure_ascii=False, default=str)}
        finally:
            if cancel_on_disconnect and stream.outcome is None:  # the client left a run it asked to stop so
                asyncio.get_running_loop().create_task(_cancel_quietly(runs, thread_id, run_id))

    return EventSourceResponse(generate(), headers=_location(thread_id, run_id))


async def _cancel_quietly(runs: Runs, thread_id: str, run_id: str) -> None:
    try:
        await runs.cancel(thread_id, run_id)
    except Conflict:
        pass  # it ended meanwhile


async def _wait(runs: Runs, started: StartedRun) -> JSONResponse:
    await started.handle.collect()
    values = await runs.end_values(started.handle.turn_id)
    return JSONResponse(values, headers=_location(started.thread_id, started.handle.turn_id))


async def _created(runs: Runs, started: StartedRun) -> JSONResponse:
    turn, graph_id = await asyncio.to_thread(runs.run, started.thread_id, started.handle.turn_id)
    body = wire.jsonable(dict(wire.run(turn, graph_id)))
    return JSONResponse(body, headers=_location(started.thread_id, started.handle.turn_id))
