"""Helpers for the workbench tests: a small test scenario, settings, SSE parsing, a live server."""

from __future__ import annotations

import contextlib
import json
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import uvicorn
from fastapi.testclient import TestClient

from app.main import create_app
from app.scenario_catalog import ScenarioCatalog
from app.settings import WorkbenchSettings
from scenarios.scenario import Scenario
from tests.fakes.scripted_openai import free_port
from tests.workbench_auth import AUTH_HEADERS
from tools.base import Tool, ToolError, object_schema

SYSTEM_PROMPT = "You are the lab assistant. Use the tools."


def _echo(ctx, text: str) -> dict:
    return {"echo": text}


def _big_table(ctx, rows: int) -> list[dict]:
    table = [{"row": i, "status": "ok", "note": "nominal reading " * 3} for i in range(rows)]
    table[rows // 2] = {"row": rows // 2, "status": "ERROR", "note": "pressure anomaly detected"}
    return table


def _explode(ctx) -> dict:
    raise RuntimeError("sensor bus exploded")


def _refuse(ctx, item: str) -> dict:
    raise ToolError(f"no item called {item!r}")


PROPOSALS_EXECUTED: list[dict] = []  # must stay empty: the app never calls a proposed action's func


def _propose(ctx, action: str, target: str, reason: str) -> dict:
    PROPOSALS_EXECUTED.append({"action": action, "target": target})
    return {"action": action, "target": target, "reason": reason}


LAB_TOOLS = (
    Tool("echo", "Echo the text back.", object_schema({"text": {"type": "string"}}, ["text"]), _echo),
    Tool("big_table", "A large table of readings.", object_schema({"rows": {"type": "integer"}}, ["rows"]),
         _big_table),
    Tool("explode", "A tool with a bug.", object_schema({}), _explode),
    Tool("lookup", "Look an item up.", object_schema({"item": {"type": "string"}}, ["item"]), _refuse),
    Tool("propose_action", "Propose an action for the operator.",
         object_schema({"action": {"type": "string", "enum": ["restart_service", "rollback_release"]},
                        "target": {"type": "string"}, "reason": {"type": "string"}},
                       ["action", "target", "reason"]),
         _propose, requires_approval=True),
)

LAB = Scenario(name="lab", title="Lab", description="A test scenario.", system_prompt=SYSTEM_PROMPT,
               tools=LAB_TOOLS, starter_questions=("What is up?",), summarize=lambda: {"rows": 3})

OTHER = Scenario(name="other", title="Other", description="Another test scenario.",
                 system_prompt="Other prompt.", tools=LAB_TOOLS[:1], starter_questions=(),
                 summarize=lambda: {"items": 1})


def lab_catalog() -> ScenarioCatalog:
    return ScenarioCatalog([LAB, OTHER])


def make_settings(tmp_path: Path, base_url: str, **overrides) -> WorkbenchSettings:
    """Small limits, data in `tmp_path`; the database comes from DATABASE_URL (set by the
    `workbench_database` fixture of tests/app/conftest.py; unset: SQLite in the data dir)."""
    values: dict[str, Any] = dict(
        llm_base_url=base_url, llm_model="", data_dir=tmp_path / "var", llm_timeout_s=5.0,
        step_budget=4, tool_result_max_chars=600, tool_result_max_tokens=1000, max_message_chars=500)
    values.update(overrides)
    return WorkbenchSettings(_env_file=None, **values)


@contextlib.contextmanager
def workbench_client(settings: WorkbenchSettings, catalog: ScenarioCatalog | None = None) -> Iterator[TestClient]:
    app = create_app(settings, catalog or lab_catalog())
    with TestClient(app, raise_server_exceptions=False, headers=AUTH_HEADERS) as client:
        yield client


def parse_sse(text: str) -> list[dict]:
    """The `data` JSON of each SSE event, checking that `event:` matches its "type"."""
    events = []
    for block in text.replace("\r\n", "\n").split("\n\n"):
        name, data = None, []
        for line in block.split("\n"):
            if line.startswith("event:"):
                name = line[6:].strip()
            elif line.startswith("data:"):
                data.append(line[5:].strip())
        if data:
            event = json.loads("\n".join(data))
            assert event["type"] == name
            events.append(event)
    return events


def post_turn(client: TestClient, session_id: str, message: str, **fields) -> list[dict]:
    response = client.post(f"/api/sessions/{session_id}/turns", json={"message": message, **fields})
    assert response.status_code == 200, response.text
    assert response.headers["content-type"].startswith("text/event-stream")
    return parse_sse(response.text)


def decide(client: TestClient, approval_id: str, approved: bool, comment: str = "") -> list[dict]:
    response = client.post(f"/api/approvals/{approval_id}", json={"approved": approved, "comment": comment})
    assert response.status_code == 200, response.text
    return parse_sse(response.text)


def forced_turn_rejecting_proposals(client: TestClient, session_id: str, message: str) -> list[dict]:
    """One non-streamed turn with the first step forced to a tool; every proposed action met on
    the way is rejected, so the turn ends with an answer and nothing is applied."""
    response = client.post(f"/api/sessions/{session_id}/turns",
                           json={"message": message, "force_tool": True, "stream": False})
    assert response.status_code == 200, response.text
    events = response.json()["events"]
    while events[-1]["type"] == "approval_request":
        more = client.post(f"/api/approvals/{events[-1]['approval_id']}",
                           json={"approved": False, "comment": "test", "stream": False})
        assert more.status_code == 200, more.text
        events += more.json()["events"]
    return events


def new_session(client: TestClient, scenario: str = "lab") -> dict:
    response = client.post("/api/sessions", json={"scenario": scenario})
    assert response.status_code == 201, response.text
    return response.json()


def of_type(events: list[dict], kind: str) -> list[dict]:
    return [e for e in events if e["type"] == kind]


@contextlib.contextmanager
def live_server(app, port: int | None = None) -> Iterator[str]:
    """Serve `app` with uvicorn on a free loopback port; yields its base URL."""
    port = port or free_port()
    server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=port, log_level="warning"))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    deadline = time.monotonic() + 15
    while not server.started:
        if time.monotonic() > deadline or not thread.is_alive():
            raise RuntimeError("workbench test server did not start")
        time.sleep(0.02)
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        server.should_exit = True
        thread.join(timeout=15)


class SseReader(threading.Thread):
    """Reads one SSE response (a turn's events) to its end in the background; `events` grows as
    they arrive."""

    def __init__(self, method: str, url: str, **kwargs) -> None:
        super().__init__(daemon=True)
        self.method, self.url, self.kwargs = method, url, kwargs
        self.events: list[dict] = []
        self.arrivals: list[float] = []  # time.monotonic() when each event arrived
        self.error: httpx.HTTPError | None = None  # the transport error that cut the stream (a killed server)

    def run(self) -> None:
        try:
            kwargs = {**self.kwargs, "headers": {**AUTH_HEADERS, **self.kwargs.get("headers", {})}}
            with httpx.stream(self.method, self.url, timeout=60, **kwargs) as response:
                assert response.status_code == 200, response.read()
                for line in response.iter_lines():
                    if line.startswith("data:"):
                        self.arrivals.append(time.monotonic())
                        self.events.append(json.loads(line[5:]))
        except httpx.HTTPError as exc:
            self.error = exc

    def wait_for(self, test, what: str) -> None:
        deadline = time.monotonic() + 30
        while not test(self.events):
            assert time.monotonic() < deadline, f"no {what} within 30 s: {self.events[-3:]}"
            time.sleep(0.02)
