"""End to end: the workbench against arbor-server on the embedded model, one turn per scenario,
on each database the workbench supports (SQLite and PostgreSQL, through DATABASE_URL).

A 135M model does not choose tools well, so the first step is forced (tool_choice
"required"). The assertions are about structure, not wording: a tool ran, its result reached
the model in the next request, and a non-empty answer came back. A proposed action met on
the way is rejected (the run must then still end with an answer).
"""

from __future__ import annotations

import pytest

from tests.app.real_backends import real_backends
from tests.app.support import forced_turn_rejecting_proposals, workbench_client

pytestmark = pytest.mark.model


@pytest.fixture(scope="module")
def backends(tmp_path_factory):
    with real_backends(tmp_path_factory.mktemp("e2e-logs"), ["--parallel", "2"]) as urls:
        yield urls


@pytest.mark.parametrize("scenario", ["financial_research", "field_maintenance", "edge_incident", "story_writer"])
def test_one_forced_tool_turn_per_scenario(scenario, backends, workbench_database, tmp_path):
    from app.settings import WorkbenchSettings

    settings = WorkbenchSettings(_env_file=None, llm_base_url=backends["llm"], incident_base_url=backends["incident"],
                                 data_dir=tmp_path / "var", llm_timeout_s=300, llm_max_tokens=96,
                                 llm_temperature=0.0, step_budget=3)
    with workbench_client(settings, catalog=_real_catalog()) as client:
        detail = client.get(f"/api/scenarios/{scenario}").json()
        session = client.post("/api/sessions", json={"scenario": scenario}).json()
        question = detail["starter_questions"][0]
        events = forced_turn_rejecting_proposals(client, session["id"], question)

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
    # the run's checkpoints went to the database under test (read straight from it)
    assert workbench_database.checkpoint_threads(settings), f"no checkpoint in {workbench_database.kind}"


def _real_catalog():
    """The registry's scenarios, the story writer with its smallest corpus (the default one fills
    most of the 8K context: ~45 s of prefill on 2 cores, for nothing these tests look at)."""
    from app.scenario_catalog import ScenarioCatalog
    from scenarios.registry import list_scenarios
    from scenarios.story_writer.scenario import build_scenario

    return ScenarioCatalog([build_scenario(0) if s.name == "story_writer" else s for s in list_scenarios()])
