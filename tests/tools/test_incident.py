"""The simulated incident service and the tools that read it over real HTTP."""

import contextlib
import os
import socket
import subprocess
import sys
import threading
import time

import httpx
import pytest
import uvicorn

from harness.serving.ports import free_port
from scenarios.edge_incident import service, world
from scenarios.edge_incident.service import create_app
from tools.base import ToolContext, ToolError, run_tool
from tools.incident import INCIDENT_TOOLS

TOOLS = {t.name: t for t in INCIDENT_TOOLS}
REPO_ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


@contextlib.contextmanager
def serving(app):
    """Run `app` in a real uvicorn server on a free loopback port; yield its base URL."""
    port = free_port()
    server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=port, log_level="warning"))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    deadline = time.monotonic() + 20
    while not server.started:
        if not thread.is_alive() or time.monotonic() > deadline:
            raise RuntimeError("incident service did not start")
        time.sleep(0.02)
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        server.should_exit = True
        thread.join(timeout=10)


@pytest.fixture(scope="module")
def services():
    """One real server per state: {state: ToolContext pointing at it}."""
    with contextlib.ExitStack() as stack:
        yield {state: ToolContext(incident_base_url=stack.enter_context(serving(create_app(state))))
               for state in world.STATES}


async def call(ctx, name, **arguments):
    return await run_tool(TOOLS[name], ctx, arguments)


# --- the service itself (in-process ASGI) ---------------------------------------------------

async def asgi_get(state, path, **params):
    transport = httpx.ASGITransport(app=create_app(state))
    async with httpx.AsyncClient(transport=transport, base_url="http://incident") as client:
        return await client.get(path, params=params)


@pytest.mark.parametrize("state, code, status", [("healthy", 200, "ok"), ("degraded", 200, "degraded"),
                                                 ("failed", 503, "failed")])
async def test_health_depends_on_state(state, code, status):
    response = await asgi_get(state, "/health")
    assert response.status_code == code and response.json()["status"] == status


async def test_state_changes_status_metrics_and_dependencies():
    healthy, degraded, failed = [(await asgi_get(s, "/metrics")).json()["current"] for s in world.STATES]
    assert healthy["error_rate_pct"] < degraded["error_rate_pct"] < failed["error_rate_pct"]
    assert healthy["queue_depth"] < degraded["queue_depth"] < failed["queue_depth"]
    deps = {s: {d["name"]: d["status"] for d in (await asgi_get(s, "/dependencies")).json()["dependencies"]}
            for s in world.STATES}
    assert set(deps["healthy"].values()) == {"ok"}
    assert deps["degraded"]["redis"] == "degraded" and deps["degraded"]["postgres"] == "ok"
    assert deps["failed"]["postgres"] == "down"
    assert (await asgi_get("healthy", "/status")).json()["version"] == "2.4.1"
    assert (await asgi_get("failed", "/status")).json()["restarts_1h"] > 0


async def test_service_is_deterministic():
    first = [(await asgi_get("degraded", p)).json() for p in ("/status", "/metrics", "/logs")]
    second = [(await asgi_get("degraded", p)).json() for p in ("/status", "/metrics", "/logs")]
    assert first == second


async def test_log_filters():
    all_logs = (await asgi_get("failed", "/logs", limit=200)).json()
    times = [r["time"] for r in all_logs["logs"]]
    assert times == sorted(times, reverse=True) and all_logs["total"] == len(world.logs("failed"))
    errors = (await asgi_get("failed", "/logs", level="error", limit=200)).json()["logs"]
    assert errors and {r["level"] for r in errors} <= {"error", "critical"}
    redis = (await asgi_get("degraded", "/logs", component="redis")).json()["logs"]
    assert redis and {r["component"] for r in redis} == {"redis"}
    recent = (await asgi_get("degraded", "/logs", since_minutes=10)).json()["logs"]
    assert recent and all(r["time"] >= "2024-06-01T11:50:00Z" for r in recent)
    assert (await asgi_get("healthy", "/logs", contains="dedup")).json()["total"] == 0
    assert (await asgi_get("healthy", "/logs", level="loud")).status_code == 422


def test_create_app_rejects_unknown_state():
    with pytest.raises(ValueError, match="unknown state 'broken'"):
        create_app("broken")


def test_cli_rejects_bad_state_from_environment(monkeypatch, capsys):
    monkeypatch.setenv("INCIDENT_STATE", "sideways")
    with pytest.raises(SystemExit):
        service.main([])
    assert "INCIDENT_STATE='sideways'" in capsys.readouterr().err


# --- the tools over real HTTP -----------------------------------------------------------------

async def test_tools_read_the_running_service(services):
    status = await call(services["degraded"], "service_status")
    assert status["health"] == "degraded" and status["version"] == "2.5.0"
    failed = await call(services["failed"], "service_status")
    assert failed["health"] == "failed" and failed["health_http_status"] == 503
    metrics = await call(services["failed"], "service_metrics")
    assert metrics["current"]["db_pool_in_use"] == "50/50"
    deps = await call(services["failed"], "service_dependencies")
    assert {d["name"]: d["status"] for d in deps["dependencies"]}["postgres"] == "down"
    logs = await call(services["degraded"], "service_logs", level="error", component="redis", limit=5)
    assert logs["logs"] and all(r["component"] == "redis" for r in logs["logs"])
    healthy = await call(services["healthy"], "service_logs", level="warning")
    assert healthy["total"] == 0


async def test_propose_action_only_formats_the_proposal(services):
    tool = TOOLS["propose_action"]
    assert tool.requires_approval
    result = await call(services["degraded"], "propose_action", action="rollback_release",
                        target="edge-event-api", reason="2.5.0 floods redis")
    assert result == {"proposal": {"action": "rollback_release", "target": "edge-event-api",
                                   "reason": "2.5.0 floods redis"},
                      "status": "awaiting_operator_approval", "executed": False}
    # The service is untouched: still degraded on release 2.5.0.
    assert (await call(services["degraded"], "service_status"))["version"] == "2.5.0"
    with pytest.raises(ToolError, match="'action' must be one of"):
        await call(services["degraded"], "propose_action", action="delete_database", target="x", reason="y")


async def test_service_down_is_a_readable_tool_error():
    ctx = ToolContext(incident_base_url=f"http://127.0.0.1:{free_port()}")
    with pytest.raises(ToolError, match=r"incident service at http://127\.0\.0\.1:\d+ is unreachable"):
        await call(ctx, "service_status")


async def test_wrong_path_is_a_readable_tool_error(services):
    ctx = ToolContext(incident_base_url=services["healthy"].incident_base_url + "/nope")
    with pytest.raises(ToolError, match="/metrics answered HTTP 404"):
        await call(ctx, "service_metrics")


async def test_silent_service_times_out_with_a_readable_tool_error():
    with socket.socket() as listener:  # accepts connections, never answers
        listener.bind(("127.0.0.1", 0))
        listener.listen()
        ctx = ToolContext(incident_base_url=f"http://127.0.0.1:{listener.getsockname()[1]}",
                          http_timeout_s=0.3)
        with pytest.raises(ToolError, match="did not answer /metrics within 0.3 s"):
            await call(ctx, "service_metrics")


def test_module_entry_point_serves_the_state():
    port = free_port()
    process = subprocess.Popen(
        [sys.executable, "-m", "scenarios.edge_incident.service", "--state", "failed", "--port", str(port)],
        cwd=REPO_ROOT, env={**os.environ, "PYTHONPATH": REPO_ROOT},
        stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
    )
    try:
        deadline = time.monotonic() + 30
        while True:
            try:
                response = httpx.get(f"http://127.0.0.1:{port}/health", timeout=1)
                break
            except httpx.TransportError:
                assert process.poll() is None, process.stderr.read().decode()
                assert time.monotonic() < deadline, "service did not start"
                time.sleep(0.1)
        assert response.status_code == 503 and response.json()["status"] == "failed"
    finally:
        process.terminate()
        process.wait(timeout=10)
