"""End to end: the workbench against arbor-server on the embedded model, one turn per scenario.

A 135M model does not choose tools well, so the first step is forced (tool_choice
"required"). The assertions are about structure, not wording: a tool ran, its result reached
the model in the next request, and a non-empty answer came back. A proposed action met on
the way is rejected (the run must then still end with an answer).
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest

from tests.app.support import workbench_client
from tests.fakes.scripted_openai import free_port
from tests.server.conftest import embedded_model_available

pytestmark = pytest.mark.model

ROOT = Path(__file__).resolve().parents[2]


def _start(args: list[str], log: Path) -> subprocess.Popen:
    env = {**os.environ, "PYTHONPATH": str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", "")}
    handle = log.open("w")
    return subprocess.Popen([sys.executable, *args], cwd=ROOT, env=env, stdout=handle, stderr=subprocess.STDOUT)


def _wait_healthy(url: str, process: subprocess.Popen, log: Path, timeout_s: float) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if process.poll() is not None:
            pytest.fail(f"{url} exited with {process.returncode}:\n{log.read_text()[-3000:]}")
        try:
            if httpx.get(url, timeout=2).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        time.sleep(0.5)
    pytest.fail(f"{url} not healthy after {timeout_s:.0f} s:\n{log.read_text()[-3000:]}")


def _stop(process: subprocess.Popen) -> None:
    process.terminate()
    try:
        process.wait(timeout=20)
    except subprocess.TimeoutExpired:
        process.kill()
        process.wait(timeout=10)


@pytest.fixture(scope="module")
def backends(tmp_path_factory):
    reason = embedded_model_available()
    if reason:
        pytest.skip(reason)
    logs = tmp_path_factory.mktemp("e2e-logs")
    llm_port, incident_port = free_port(), free_port()
    server = _start(["-m", "server", "--port", str(llm_port), "--parallel", "2"], logs / "server.log")
    incident = _start(["-m", "scenarios.edge_incident.service", "--state", "degraded", "--host", "127.0.0.1",
                       "--port", str(incident_port)], logs / "incident.log")
    try:
        _wait_healthy(f"http://127.0.0.1:{incident_port}/health", incident, logs / "incident.log", 60)
        _wait_healthy(f"http://127.0.0.1:{llm_port}/health", server, logs / "server.log", 300)
        yield {"llm": f"http://127.0.0.1:{llm_port}/v1", "incident": f"http://127.0.0.1:{incident_port}"}
    finally:
        _stop(server)
        _stop(incident)


@pytest.mark.parametrize("scenario", ["financial_research", "field_maintenance", "edge_incident"])
def test_one_forced_tool_turn_per_scenario(scenario, backends, tmp_path):
    from app.settings import WorkbenchSettings

    settings = WorkbenchSettings(_env_file=None, llm_base_url=backends["llm"], incident_base_url=backends["incident"],
                                 data_dir=tmp_path / "var", llm_timeout_s=300, llm_max_tokens=96,
                                 llm_temperature=0.0, step_budget=3)
    with workbench_client(settings, catalog=_real_catalog()) as client:
        detail = client.get(f"/api/scenarios/{scenario}").json()
        session = client.post("/api/sessions", json={"scenario": scenario}).json()
        question = detail["starter_questions"][0]
        response = client.post(f"/api/sessions/{session['id']}/turns",
                               json={"message": question, "force_tool": True, "stream": False})
        assert response.status_code == 200, response.text
        events = response.json()["events"]
        while events[-1]["type"] == "approval_request":
            more = client.post(f"/api/approvals/{events[-1]['approval_id']}",
                               json={"approved": False, "comment": "test", "stream": False})
            assert more.status_code == 200, more.text
            events += more.json()["events"]

        results = [e for e in events if e["type"] == "tool_result"]
        if not results:
            spans = client.get(f"/api/sessions/{session['id']}/trace").json()["spans"]
            first = next((s for s in spans if s["kind"] == "model"), {})
        assert results, f"no tool ran: {[e['type'] for e in events]}; first model call answered {first.get('response')}"
        final = events[-1]
        assert final["type"] == "final", final
        assert final["content"].strip(), "the model answered with an empty message"

        spans = client.get(f"/api/sessions/{session['id']}/trace").json()["spans"]
        model_spans = [s for s in spans if s["kind"] == "model"]
        assert model_spans[0]["request"]["tool_choice"] == "required"
        assert len(model_spans) >= 2
        seen = [m for s in model_spans[1:] for m in s["request"]["messages"] if m["role"] == "tool"]
        assert results[0]["content"] in [m["content"] for m in seen], "the tool result never reached the model"
        assert all(s["attributes"].get("gen_ai.usage.input_tokens") for s in model_spans)
        assert all("gen_ai.usage.cache_read.input_tokens" in s["attributes"] for s in model_spans)


def _real_catalog():
    from app.scenario_catalog import ScenarioCatalog

    return ScenarioCatalog()
