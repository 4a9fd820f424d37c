"""Traces carry GenAI attributes and cache numbers; big tool results are trimmed + kept; manifests."""

import json

import pytest

from harness.manifest import parse_manifest
from tests.app.support import make_settings, new_session, of_type, post_turn, workbench_client
from tests.fakes.scripted_openai import ScriptedReply, scripted_server, tool_call

pytestmark = pytest.mark.usefixtures("workbench_database")  # each test on SQLite and PostgreSQL


def test_trace_spans_use_genai_names_and_report_cache(tmp_path):
    replies = [ScriptedReply(tool_calls=[tool_call("big_table", {"rows": 200}, "c1")], cached_tokens=5,
                             cache_source="S"),
               ScriptedReply(content="Row 100 shows a pressure anomaly.", cached_tokens=40, cache_source="A")]
    with scripted_server(replies) as fake, workbench_client(make_settings(tmp_path, fake.base_url)) as client:
        session = new_session(client)
        events = post_turn(client, session["id"], "Check the table")
        (result,) = of_type(events, "tool_result")
        assert result["trimmed"] is True and result["artifact_id"]
        assert len(result["content"]) <= 600  # the budget of make_settings
        assert "ERROR" in result["content"] and "pressure anomaly" in result["content"]  # evidence kept
        assert result["artifact_id"] in result["content"]
        # the trimmed text is what the model saw
        assert fake.bodies[1]["messages"][-1]["content"] == result["content"]

        trace = client.get(f"/api/sessions/{session['id']}/trace").json()
        model_spans = [s for s in trace["spans"] if s["kind"] == "model"]
        tool_spans = [s for s in trace["spans"] if s["kind"] == "tool"]
        assert len(model_spans) == 2 and len(tool_spans) == 1
        first = model_spans[0]["attributes"]
        assert first["gen_ai.operation.name"] == "chat"
        assert first["gen_ai.request.model"] == "scripted-fake"
        assert first["gen_ai.usage.input_tokens"] > 0 and first["gen_ai.usage.output_tokens"] > 0
        assert first["gen_ai.usage.cache_read.input_tokens"] == 5
        assert first["arbor.cache.source"] == "S"
        assert model_spans[1]["attributes"]["arbor.cache.source"] == "A"
        assert model_spans[0]["ttft_ms"] is not None and model_spans[0]["duration_ms"] >= model_spans[0]["ttft_ms"]
        assert model_spans[0]["request"] == fake.bodies[0]
        assert model_spans[0]["response"]["message"]["tool_calls"][0]["id"] == "c1"

        tool = tool_spans[0]
        assert tool["attributes"]["gen_ai.operation.name"] == "execute_tool"
        assert tool["attributes"]["gen_ai.tool.name"] == "big_table"
        assert tool["attributes"]["gen_ai.tool.call.id"] == "c1"
        assert tool["attributes"]["arbor.tool.trimmed"] is True
        assert tool["request"] == {"arguments": {"rows": 200}}

        artifact = client.get(f"/api/artifacts/{tool['artifact_id']}").json()
        assert len(json.loads(artifact["content"])) == 200  # nothing lost
        assert artifact["chars"] > artifact["context_chars"]

        summary = trace["summary"]
        assert summary["model_calls"] == 2 and summary["tool_calls"] == 1
        assert summary["cached_input_tokens"] == 45
        assert summary["computed_input_tokens"] == summary["input_tokens"] - 45

        turn_only = client.get(f"/api/sessions/{session['id']}/trace",
                               params={"turn_id": events[0]["turn_id"]}).json()
        assert len(turn_only["spans"]) == 3


def test_manifest_lists_exact_request_bodies(tmp_path):
    replies = [ScriptedReply(tool_calls=[tool_call("echo", {"text": "x"})]), ScriptedReply(content="done here"),
               ScriptedReply(content="second answer")]
    with scripted_server(replies) as fake, workbench_client(make_settings(tmp_path, fake.base_url)) as client:
        session = new_session(client)
        post_turn(client, session["id"], "one")
        post_turn(client, session["id"], "two")
        response = client.get(f"/api/sessions/{session['id']}/manifest")
        assert response.status_code == 200
        assert response.headers["content-type"].startswith("application/x-ndjson")
        lines = list(parse_manifest(response.text))
        assert [line.body for line in lines] == fake.bodies
        assert all(line.session_id == session["id"] and line.branch_id == session["active_branch_id"]
                   for line in lines)
        assert [line.t for line in lines] == sorted(line.t for line in lines) and lines[0].t >= 0
        assert lines[1].expected_output_tokens == 2 and lines[2].expected_output_tokens == 2
        raw = json.loads(response.text.splitlines()[0])
        assert set(raw) == {"t", "session_id", "branch_id", "body", "expected_output_tokens"}
        # the echo tool's time between turn one's two requests is recorded, to be waited again by a replay;
        # a turn's first request follows the user, whose pause is not replayed
        assert lines[1].after_s is not None and 0 <= lines[1].after_s <= lines[1].t - lines[0].t
        assert lines[0].after_s is None and lines[2].after_s is None
