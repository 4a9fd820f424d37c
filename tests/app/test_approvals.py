"""Proposed actions pause the graph (LangGraph interrupt) until the operator decides."""

import pytest

from tests.app.support import (
    PROPOSALS_EXECUTED,
    decide,
    make_settings,
    new_session,
    of_type,
    post_turn,
    workbench_client,
)
from tests.fakes.scripted_openai import ScriptedReply, scripted_server, tool_call

pytestmark = pytest.mark.usefixtures("workbench_database")  # each test on SQLite and PostgreSQL

PROPOSAL = {"action": "restart_service", "target": "event-api", "reason": "queue stuck"}


def _script():
    return [ScriptedReply(tool_calls=[tool_call("echo", {"text": "status"}, "c1"),
                                      tool_call("propose_action", PROPOSAL, "c2")]),
            ScriptedReply(content="Diagnosis done; the restart is up to you.")]


@pytest.mark.parametrize("approved", [True, False])
def test_proposal_waits_for_operator_then_resumes(tmp_path, approved):
    with scripted_server(_script()) as fake, workbench_client(make_settings(tmp_path, fake.base_url)) as client:
        session = new_session(client)
        events = post_turn(client, session["id"], "Diagnose the service")
        assert events[-1]["type"] == "approval_request"
        request = events[-1]
        assert request["tool_name"] == "propose_action" and request["arguments"] == PROPOSAL
        # the ordinary tool of the same step has not run yet: tools run once, after the decision
        assert of_type(events, "tool_result") == []
        assert len(fake.bodies) == 1

        detail = client.get(f"/api/sessions/{session['id']}").json()
        assert detail["turns"][0]["status"] == "awaiting_approval"
        assert [a["id"] for a in detail["pending_approvals"]] == [request["approval_id"]]
        # the branch is busy until the decision
        busy = client.post(f"/api/sessions/{session['id']}/turns", json={"message": "and now?"})
        assert busy.status_code == 409 and busy.json()["error"]["type"] == "branch_busy"

        rest = decide(client, request["approval_id"], approved, comment="checked")
        assert rest[0]["type"] == "turn" and rest[0]["resumed"] is True
        assert rest[-1]["type"] == "final"
        assert rest[-1]["content"] == "Diagnosis done; the restart is up to you."
        results = {e["name"]: e for e in of_type(rest, "tool_result")}
        assert set(results) == {"echo", "propose_action"}
        verdict = "approved" if approved else "rejected"
        assert f"operator {verdict}" in results["propose_action"]["content"]
        assert '"executed_by_agent":false' in results["propose_action"]["content"]

        # what the model saw next: both results, the decision included
        tool_messages = [m for m in fake.bodies[1]["messages"] if m["role"] == "tool"]
        assert [m["tool_call_id"] for m in tool_messages] == ["c1", "c2"]
        assert verdict in tool_messages[1]["content"]

        approval = client.get(f"/api/approvals/{request['approval_id']}").json()
        assert approval["status"] == verdict and approval["comment"] == "checked"
        assert approval["decided_by"] == "operator"  # signed in with the token (app/auth/guard.py)
        again = client.post(f"/api/approvals/{request['approval_id']}", json={"approved": True})
        assert again.status_code == 409 and again.json()["error"]["type"] == "approval_decided"

        spans = client.get(f"/api/sessions/{session['id']}/trace").json()["spans"]
        proposal_span = next(s for s in spans if s["name"] == "execute_tool propose_action")
        assert proposal_span["attributes"]["arbor.approval.decision"] == verdict
        assert proposal_span["attributes"]["arbor.tool.requires_approval"] is True
        turn = client.get(f"/api/sessions/{session['id']}").json()["turns"][0]
        assert turn["status"] == "completed"
        assert PROPOSALS_EXECUTED == []


def test_pending_approval_survives_a_workbench_restart(tmp_path):
    with scripted_server(_script()) as fake:
        settings = make_settings(tmp_path, fake.base_url)
        with workbench_client(settings) as client:
            session = new_session(client)
            request = post_turn(client, session["id"], "Diagnose the service")[-1]
            assert request["type"] == "approval_request"
        with workbench_client(settings) as client:  # a new process on the same data dir
            pending = client.get("/api/approvals", params={"session_id": session["id"]}).json()
            assert [a["id"] for a in pending] == [request["approval_id"]]
            rest = decide(client, request["approval_id"], True)
            assert rest[-1]["type"] == "final"
            assert client.get(f"/api/sessions/{session['id']}").json()["turns"][0]["status"] == "completed"


def test_invalid_proposal_is_not_shown_to_the_operator(tmp_path):
    bad = {"action": "format_disk", "target": "db", "reason": "why not"}
    script = [ScriptedReply(tool_calls=[tool_call("propose_action", bad, "c1")]), ScriptedReply(content="ok")]
    with scripted_server(script) as fake, workbench_client(make_settings(tmp_path, fake.base_url)) as client:
        session = new_session(client)
        events = post_turn(client, session["id"], "do something")
        assert of_type(events, "approval_request") == []
        (result,) = of_type(events, "tool_result")
        assert result["error"] and "format_disk" in result["error"]
        assert events[-1]["type"] == "final"


def test_unknown_approval_is_404(tmp_path):
    with scripted_server([]) as fake, workbench_client(make_settings(tmp_path, fake.base_url)) as client:
        response = client.post("/api/approvals/nope", json={"approved": True})
        assert response.status_code == 404
        assert response.json()["error"]["type"] == "unknown_approval"
