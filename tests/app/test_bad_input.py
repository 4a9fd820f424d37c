"""Bad input gets a readable JSON error with a proper status; the workbench stays usable."""

import pytest

from tests.app.support import make_settings, new_session, of_type, post_turn, workbench_client
from tests.fakes.scripted_openai import ScriptedOpenAI, ScriptedReply, free_port, scripted_server, tool_call

pytestmark = pytest.mark.usefixtures("workbench_database")  # each test on SQLite and PostgreSQL


def _error(response, status, error_type):
    assert response.status_code == status, response.text
    error = response.json()["error"]
    assert error["type"] == error_type and error["message"]
    return error["message"]


@pytest.fixture
def client(tmp_path):
    with scripted_server([]) as fake, workbench_client(make_settings(tmp_path, fake.base_url)) as client:
        yield client


def test_unknown_things(client):
    message = _error(client.post("/api/sessions", json={"scenario": "nope"}), 404, "unknown_scenario")
    assert "lab" in message  # names the known ones
    _error(client.get("/api/scenarios/nope"), 404, "unknown_scenario")
    _error(client.get("/api/sessions/nope"), 404, "unknown_session")
    _error(client.post("/api/sessions/nope/turns", json={"message": "hi"}), 404, "unknown_session")
    _error(client.get("/api/sessions/nope/trace"), 404, "unknown_session")
    _error(client.get("/api/sessions/nope/manifest"), 404, "unknown_session")
    _error(client.get("/api/turns/nope"), 404, "unknown_turn")
    _error(client.get("/api/artifacts/nope"), 404, "unknown_artifact")
    _error(client.get("/api/no-such-route"), 404, "not_found")
    session = new_session(client)
    _error(client.post(f"/api/sessions/{session['id']}/turns", json={"message": "hi", "branch_id": "nope"}),
           404, "unknown_branch")


def test_bad_messages(client):
    session = new_session(client)
    url = f"/api/sessions/{session['id']}/turns"
    message = _error(client.post(url, json={"message": "x" * 501}), 413, "message_too_long")
    assert "500" in message
    _error(client.post(url, json={"message": "   "}), 422, "empty_message")
    assert "message" in _error(client.post(url, json={}), 422, "invalid_request")
    _error(client.post(url, json={"message": "hi", "tool_choice": "sometimes"}), 422, "invalid_tool_choice")
    _error(client.post(url, json={"message": "hi", "tool_choice": {"type": "function", "function": {"name": "x"}}}),
           422, "invalid_tool_choice")
    _error(client.post(f"/api/sessions/{session['id']}/preview", json={"message": "x" * 501}), 413,
           "message_too_long")
    # nothing was recorded for rejected requests
    assert client.get(f"/api/sessions/{session['id']}").json()["turns"] == []


@pytest.mark.expects_5xx  # a non-streamed turn on a backend that is down answers 502
def test_backend_down_then_retry_works(tmp_path):
    port = free_port()  # nothing listens here yet
    settings = make_settings(tmp_path, f"http://127.0.0.1:{port}/v1", llm_model="m")
    with workbench_client(settings) as client:
        session = new_session(client)
        events = post_turn(client, session["id"], "hello")
        error = events[-1]
        assert error["type"] == "error" and error["error_type"] == "model_backend_unreachable"
        assert f"127.0.0.1:{port}" in error["message"] and error["retryable"] is True
        health = client.get("/api/health").json()
        assert health["status"] == "degraded" and health["llm"]["reachable"] is False and health["llm"]["error"]

        detail = client.get(f"/api/sessions/{session['id']}").json()
        assert detail["turns"][0]["status"] == "failed"
        assert detail["branches"][0]["head_turn_id"] is None  # the failed turn is not history

        trace = client.get(f"/api/sessions/{session['id']}/trace").json()
        assert trace["spans"][0]["status"] == "error"
        assert trace["spans"][0]["attributes"]["error.type"] == "unreachable"
        assert client.get(f"/api/sessions/{session['id']}/manifest").text == ""

        # non-streamed turns answer 502 with the readable error
        response = client.post(f"/api/sessions/{session['id']}/turns", json={"message": "hello", "stream": False})
        assert response.status_code == 502 and "unreachable" in response.json()["error"]["message"]

        with ScriptedOpenAI([ScriptedReply(content="back again")], port=port):
            assert client.get("/api/health").json()["status"] == "ok"
            retry = post_turn(client, session["id"], "hello")
            assert retry[-1]["type"] == "final" and retry[-1]["content"] == "back again"
        detail = client.get(f"/api/sessions/{session['id']}").json()
        assert [t["status"] for t in detail["turns"]] == ["failed", "failed", "completed"]
        assert detail["branches"][0]["head_turn_id"] == detail["turns"][-1]["id"]


def test_backend_timeout_and_http_error(tmp_path):
    # a timeout well below the late reply's delay, and well above what a prompt answer takes on a loaded machine
    # (at 0.5 s the 500 reply itself timed out once while real-model tests ran beside it)
    replies = [ScriptedReply(content="late", delay_s=6.0), ScriptedReply(status=500), ScriptedReply(content="ok")]
    with scripted_server(replies) as fake, \
            workbench_client(make_settings(tmp_path, fake.base_url, llm_timeout_s=2.0)) as client:
        session = new_session(client)
        timed_out = post_turn(client, session["id"], "hello")[-1]
        assert timed_out["error_type"] == "model_backend_timeout" and "timed out" in timed_out["message"]
        failed = post_turn(client, session["id"], "hello")[-1]
        assert failed["error_type"] == "model_backend_http_error" and "500" in failed["message"]
        assert post_turn(client, session["id"], "hello")[-1]["content"] == "ok"


def test_failing_tools_are_recorded_and_the_run_continues(tmp_path):
    replies = [ScriptedReply(tool_calls=[tool_call("explode", {}, "c1"), tool_call("lookup", {"item": "x"}, "c2"),
                                         tool_call("nope", {}, "c3"), tool_call("echo", "{not json", "c4"),
                                         tool_call("echo", {"text": 3}, "c5")]),
               ScriptedReply(content="Some tools failed.")]
    with scripted_server(replies) as fake, workbench_client(make_settings(tmp_path, fake.base_url)) as client:
        session = new_session(client)
        events = post_turn(client, session["id"], "try everything")
        assert events[-1]["type"] == "final" and events[-1]["content"] == "Some tools failed."
        results = {e["tool_call_id"]: e for e in of_type(events, "tool_result")}
        assert "RuntimeError: sensor bus exploded" in results["c1"]["error"]
        assert "no item called 'x'" in results["c2"]["error"]
        assert "unknown tool 'nope'" in results["c3"]["error"]
        assert "not valid JSON" in results["c4"]["error"]
        assert "text" in results["c5"]["error"]
        # the model saw every error as the tool's result
        tool_messages = [m for m in fake.bodies[1]["messages"] if m["role"] == "tool"]
        assert len(tool_messages) == 5 and all(m["content"].startswith("Error from tool") for m in tool_messages)

        spans = [s for s in client.get(f"/api/sessions/{session['id']}/trace").json()["spans"] if s["kind"] == "tool"]
        assert all(s["status"] == "error" for s in spans)
        assert spans[0]["attributes"]["error.type"] == "RuntimeError"
        assert spans[1]["attributes"]["error.type"] == "ToolError"
