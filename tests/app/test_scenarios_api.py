"""Scenario routes, with the test catalog and with the real scenarios registry."""

import pytest

from app.scenario_catalog import ScenarioCatalog
from tests.app.support import make_settings, workbench_client
from tests.fakes.scripted_openai import scripted_server

pytestmark = pytest.mark.usefixtures("workbench_database")  # each test on SQLite and PostgreSQL


@pytest.mark.expects_5xx  # a tool that raises answers 500 tool_failed
def test_lab_scenario_routes_and_direct_tool_runs(tmp_path):
    with scripted_server([]) as fake, workbench_client(make_settings(tmp_path, fake.base_url)) as client:
        listing = client.get("/api/scenarios").json()
        assert [s["name"] for s in listing] == ["lab", "other"]
        assert "system_prompt" not in listing[0]
        detail = client.get("/api/scenarios/lab").json()
        assert detail["data"] == {"rows": 3} and detail["system_prompt"]
        assert next(t for t in detail["tools"] if t["name"] == "propose_action")["requires_approval"] is True

        ran = client.post("/api/scenarios/lab/tools/big_table", json={"arguments": {"rows": 100}}).json()
        assert len(ran["result"]) == 100 and ran["trimmed"] is True and len(ran["context_text"]) <= 600

        def error(response, status, kind):
            assert response.status_code == status, response.text
            assert response.json()["error"]["type"] == kind

        error(client.post("/api/scenarios/lab/tools/nope", json={}), 404, "unknown_tool")
        error(client.post("/api/scenarios/lab/tools/echo", json={"arguments": {}}), 422, "tool_error")
        error(client.post("/api/scenarios/lab/tools/explode", json={}), 500, "tool_failed")
        error(client.post("/api/scenarios/lab/tools/propose_action",
                          json={"arguments": {"action": "restart_service", "target": "a", "reason": "b"}}),
              409, "requires_approval")

        health = client.get("/api/health").json()
        assert health["status"] == "ok" and health["llm"]["models"] == ["scripted-fake"]
        assert health["scenarios"] == ["lab", "other"]


def test_real_registry_is_served(tmp_path):
    with scripted_server([]) as fake, \
            workbench_client(make_settings(tmp_path, fake.base_url), ScenarioCatalog()) as client:
        names = [s["name"] for s in client.get("/api/scenarios").json()]
        assert names == ["financial_research", "field_maintenance", "edge_incident", "story_writer"]
        for name in names:
            detail = client.get(f"/api/scenarios/{name}").json()
            assert detail["data"] and detail["tools"] and detail["starter_questions"]
        edge = client.get("/api/scenarios/edge_incident").json()
        assert any(t["requires_approval"] for t in edge["tools"])
        session = client.post("/api/sessions", json={"scenario": "financial_research"}).json()
        preview = client.post(f"/api/sessions/{session['id']}/preview",
                              json={"message": "Revenue of NWR?", "force_tool": True}).json()
        assert preview["body"]["tool_choice"] == "required"
        assert preview["body"]["messages"][-1] == {"role": "user", "content": "Revenue of NWR?"}
        assert preview["headers"]["X-Arbor-Cache-State"] == "active"  # the model is called
