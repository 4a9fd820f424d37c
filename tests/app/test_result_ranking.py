"""Tool context through the graph (issue 58, item 6), against the scripted fake over real HTTP:
the turn's question reaches the trimming of its tools' results (tools node -> trimming, and the
step's fitting), so a cut keeps the items it asks about; the event and the tool span say what
was kept and name the artifact holding the original; the model's requests carry compacted tool
schemas (ARBOR_COMPACT_TOOL_SCHEMAS) and its spans their size beside the full schemas'."""

from __future__ import annotations

import json

import pytest
from sqlmodel import Session

from app.db.models import Artifact
from app.scenario_catalog import ScenarioCatalog
from scenarios.scenario import Scenario
from tests.app.support import LAB, make_settings, new_session, of_type, post_turn, workbench_client
from tests.fakes.scripted_openai import ScriptedOpenAI, ScriptedReply, scripted_server, tool_call
from tools.artifacts import READ_ARTIFACT
from tools.base import Tool, object_schema

pytestmark = pytest.mark.usefixtures("workbench_database")  # each test on SQLite and PostgreSQL

QUESTION = "How is pump-42 doing today?"


def _fleet(ctx, site: str, part: int = 0, pumps: int = 60) -> dict:
    """`pumps` pumps' readings of a site (60: about 5,000 characters): routine, but pump-9's fault."""
    rows = [{"device": f"pump-{i}", "part": part, "status": "ok", "note": f"pressure nominal at station {i % 4}"}
            for i in range(pumps)]
    rows[9] = {"device": "pump-9", "part": part, "status": "fault", "note": "bearing error, vibration high"}
    return {"site": site, "rows": rows}


FLEET = Tool("fleet", "Readings of every pump of a site.",
             object_schema({"site": {"type": "string"}, "part": {"type": "integer"}, "pumps": {"type": "integer"}},
                           ["site"]), _fleet)
PUMPS = Scenario(name="pumps", title="Pumps", description="A fleet of pumps.", system_prompt=LAB.system_prompt,
                 tools=(FLEET, READ_ARTIFACT), starter_questions=(), summarize=lambda: {})


def _devices(tool_text: str) -> list[str]:
    body = json.loads(tool_text.rsplit("\n[trimmed", 1)[0])
    return [r["device"] for r in body["rows"] if isinstance(r, dict)]


def test_the_turns_question_ranks_what_a_trimmed_result_keeps(tmp_path):
    replies = [ScriptedReply(tool_calls=[tool_call("fleet", {"site": "north"}, "f1")]),
               ScriptedReply(content="pump-42 is fine; pump-9 has a bearing fault.")]
    settings = make_settings(tmp_path, "http://placeholder/v1", tool_result_max_chars=900)
    with scripted_server(replies) as fake, \
            workbench_client(settings.model_copy(update={"llm_base_url": fake.base_url}),
                             ScenarioCatalog([PUMPS])) as client:
        session = new_session(client, "pumps")["id"]
        events = post_turn(client, session, QUESTION, force_tool=True)
        assert events[-1]["type"] == "final", events[-1]
        sent = next(m["content"] for m in fake.bodies[1]["messages"] if m["role"] == "tool")
        kept = _devices(sent)
        assert "pump-42" in kept and "pump-9" in kept, "the pump asked about, and the fault"
        assert len(kept) < 60 and kept == sorted(kept, key=lambda d: int(d.split("-")[1]))

        (result,) = of_type(events, "tool_result")
        ranking = result["ranking"]
        assert result["trimmed"] and ranking["question"] == QUESTION and "42" in ranking["terms"]
        assert "north" in ranking["terms"], "the call's arguments count too"
        (cut,) = ranking["lists"]
        assert cut["path"] == "$.rows" and cut["items"] == 60 and {9, 42} <= set(cut["kept"])

        spans = client.get(f"/api/sessions/{session}/trace").json()["spans"]
        (tool_span,) = [s for s in spans if s["kind"] == "tool"]
        attrs = tool_span["attributes"]
        assert attrs["arbor.tool.ranking.question"] == QUESTION and attrs["arbor.tool.ranking.relevant"] >= 1
        assert attrs["arbor.tool.ranking.kept_count"] == len(kept) and attrs["arbor.tool.ranking.items"] == 60
        assert tool_span["response"]["ranking"] == ranking
        assert tool_span["artifact_id"] == result["artifact_id"] and result["artifact_id"] in sent
        with Session(client.app.state.workbench.engine) as db:
            artifact = db.get(Artifact, result["artifact_id"])
            assert artifact is not None and json.loads(artifact.content) == _fleet(None, "north")


def test_an_unrelated_question_keeps_the_fault(tmp_path):
    replies = [ScriptedReply(tool_calls=[tool_call("fleet", {"site": "north"}, "f1")]), ScriptedReply(content="ok")]
    settings = make_settings(tmp_path, "http://placeholder/v1", tool_result_max_chars=900)
    with scripted_server(replies) as fake, \
            workbench_client(settings.model_copy(update={"llm_base_url": fake.base_url}),
                             ScenarioCatalog([PUMPS])) as client:
        post_turn(client, new_session(client, "pumps")["id"], "Write a haiku about spring.", force_tool=True)
        kept = _devices(next(m["content"] for m in fake.bodies[1]["messages"] if m["role"] == "tool"))
        assert "pump-9" in kept and kept[0] == "pump-0" and "pump-42" not in kept


def test_results_fitted_together_are_ranked_by_the_question_and_their_spans_say_so(tmp_path):
    """Five results cut together to the context that remains (app/agent/result_fit.py): each
    cut keeps pump-42 by the question, the fitted events carry the ranking, and each tool span
    is updated to what the model saw."""
    def agent(body: dict) -> ScriptedReply:
        if body["messages"][-1]["role"] == "user":
            return ScriptedReply(tool_calls=[tool_call("fleet", {"site": "north", "part": p, "pumps": 200}, f"r{p}")
                                             for p in range(5)])
        return ScriptedReply(content="pump-42 is fine.")

    settings = make_settings(tmp_path, "http://placeholder/v1", llm_max_tokens=400, tool_result_max_chars=4000,
                             tool_result_max_tokens=1000)
    fake = ScriptedOpenAI(agent, n_ctx=3000, count_tools=True)
    with fake, workbench_client(settings.model_copy(update={"llm_base_url": fake.base_url}),
                                ScenarioCatalog([PUMPS])) as client:
        session = new_session(client, "pumps")["id"]
        events = post_turn(client, session, QUESTION, force_tool=True)
        assert events[-1]["type"] == "final" and events[-1]["content"] == "pump-42 is fine.", events[-1]
        fitted = [e for e in of_type(events, "tool_result") if e.get("fitted")]
        assert {e["tool_call_id"] for e in fitted} == {f"r{p}" for p in range(5)}
        assert all(e["ranking"]["question"] == QUESTION for e in fitted)
        for message in fake.bodies[-1]["messages"]:
            if message["role"] == "tool":
                assert "pump-42" in _devices(message["content"]), "the fit kept what the question asks about"
        spans = {s["attributes"]["gen_ai.tool.call.id"]: s
                 for s in client.get(f"/api/sessions/{session}/trace").json()["spans"] if s["kind"] == "tool"}
        for event in fitted:
            span = spans[event["tool_call_id"]]
            assert span["attributes"]["arbor.tool.fitted"] is True and span["attributes"]["arbor.tool.trimmed"]
            assert span["response"]["content"] == event["content"] and span["artifact_id"] == event["artifact_id"]
            assert span["attributes"]["arbor.tool.ranking.question"] == QUESTION


@pytest.mark.parametrize("compact", [True, False])
def test_requests_carry_compacted_tool_schemas_and_model_spans_their_size(tmp_path, compact):
    replies = [ScriptedReply(tool_calls=[tool_call("fleet", {"site": "north", "other": 1}, "f1")]),
               ScriptedReply(content="ok")]
    settings = make_settings(tmp_path, "http://placeholder/v1", compact_tool_schemas=compact)
    with scripted_server(replies) as fake, \
            workbench_client(settings.model_copy(update={"llm_base_url": fake.base_url}),
                             ScenarioCatalog([PUMPS])) as client:
        session = new_session(client, "pumps")["id"]
        events = post_turn(client, session, QUESTION, force_tool=True)
        first, second = fake.bodies
        assert first["tools"] == second["tools"], "the same bytes every step"
        assert ("additionalProperties" in json.dumps(first["tools"])) is not compact
        (result,) = of_type(events, "tool_result")
        assert "other" in result["error"], "an unknown argument is refused by the full schema either way"
        spans = [s for s in client.get(f"/api/sessions/{session}/trace").json()["spans"] if s["kind"] == "model"]
        for span in spans:
            attrs = span["attributes"]
            assert attrs["arbor.tools.compacted"] is compact and attrs["arbor.tools.count"] == 2
            assert (attrs["arbor.tools.schema_chars"] < attrs["arbor.tools.full_schema_chars"]) is compact
