"""The tool loop through the HTTP API against the scripted OpenAI fake over real HTTP."""

import json

import pytest

from tests.app.support import SYSTEM_PROMPT, make_settings, new_session, of_type, post_turn, workbench_client
from tests.fakes.scripted_openai import ScriptedReply, scripted_server, tool_call

pytestmark = pytest.mark.usefixtures("workbench_database")  # each test on SQLite and PostgreSQL


def test_tool_loop_runs_tool_and_feeds_result_back(tmp_path):
    replies = [ScriptedReply(tool_calls=[tool_call("echo", {"text": "ping"}, "c1")]),
               ScriptedReply(content="The echo said ping.")]
    with scripted_server(replies) as fake, workbench_client(make_settings(tmp_path, fake.base_url)) as client:
        session = new_session(client)
        events = post_turn(client, session["id"], "Echo ping please", force_tool=True)

        kinds = [e["type"] for e in events]
        assert kinds[0] == "turn" and kinds[-1] == "final"
        assert kinds.index("tool_call") < kinds.index("tool_result") < kinds.index("final")
        assert of_type(events, "tool_result")[0]["content"] == json.dumps({"echo": "ping"}, separators=(",", ":"))
        assert "".join(e["text"] for e in of_type(events, "token")) == "The echo said ping."
        assert of_type(events, "final")[0]["content"] == "The echo said ping."
        assert of_type(events, "final")[0]["outcome"] == "answered"

        first, second = fake.bodies
        assert first["messages"][0] == {"role": "system", "content": SYSTEM_PROMPT}
        assert first["messages"][-1] == {"role": "user", "content": "Echo ping please"}
        assert {t["function"]["name"] for t in first["tools"]} >= {"echo", "propose_action"}
        assert first["tool_choice"] == "required" and "tool_choice" not in second
        assert first["stream"] is True and first["stream_options"] == {"include_usage": True}
        # the tool result reached the model, paired with its call
        assert second["messages"][-2]["tool_calls"][0]["id"] == "c1"
        assert second["messages"][-1] == {"role": "tool", "tool_call_id": "c1", "content": '{"echo":"ping"}'}
        # cache hints: body extension and headers, one session key per branch; a model request
        # is active, the tools between requests and the end of the turn are told on their own
        hint_key = f"{session['id']}/{session['active_branch_id']}"
        assert first["cache"] == second["cache"] == {"session": hint_key, "state": "active"}
        assert fake.requests[0]["headers"]["x-arbor-session"] == hint_key
        assert fake.requests[0]["headers"]["x-arbor-cache-state"] == "active"
        assert fake.timeline == [("chat", first["cache"]), ("hint", {"session": hint_key, "state": "tool_wait",
                                                                            "tool": "echo"}),
                                 ("chat", second["cache"]), ("hint", {"session": hint_key, "state": "done"})]

        detail = client.get(f"/api/sessions/{session['id']}").json()
        (turn,) = detail["turns"]
        assert turn["status"] == "completed" and turn["final_answer"] == "The echo said ping."
        assert [m["role"] for m in turn["messages"]] == ["user", "assistant", "tool", "assistant"]
        assert detail["branches"][0]["head_turn_id"] == turn["id"]


def test_step_budget_stops_a_model_that_never_answers(tmp_path):
    def always_tools(body):
        return ScriptedReply(tool_calls=[tool_call("echo", {"text": "again"})])

    settings = make_settings(tmp_path, "http://127.0.0.1:1/v1", step_budget=3)
    with scripted_server(always_tools) as fake:
        settings.llm_base_url = fake.base_url
        with workbench_client(settings) as client:
            session = new_session(client)
            events = post_turn(client, session["id"], "loop forever")
            final = of_type(events, "final")[0]
            assert final["outcome"] == "budget_exhausted" and final["steps"] == 3
            assert "step budget of 3" in final["content"]
            assert len(fake.bodies) == 3
            assert len(of_type(events, "tool_result")) == 2  # the last step's calls were not executed
            assert fake.bodies[-1]["tool_choice"] == "none" and fake.bodies[-1]["cache"]["state"] == "active"
            assert [h.get("state") for h in fake.hints] == ["tool_wait", "tool_wait", "done"], \
                "done only when the turn ends at the budget, not with the last request"
            turn = client.get(f"/api/sessions/{session['id']}").json()["turns"][0]
            # every tool call of the stored history has its answer, so the next turn is a valid request
            calls = [c["id"] for m in turn["messages"] if m["role"] == "assistant" for c in m.get("tool_calls", [])]
            answered = [m["tool_call_id"] for m in turn["messages"] if m["role"] == "tool"]
            assert calls == answered


def test_non_stream_turn_returns_turn_and_events(tmp_path):
    with scripted_server([ScriptedReply(content="Hello.")]) as fake, \
            workbench_client(make_settings(tmp_path, fake.base_url)) as client:
        session = new_session(client)
        response = client.post(f"/api/sessions/{session['id']}/turns", json={"message": "hi", "stream": False})
        assert response.status_code == 200
        body = response.json()
        assert body["turn"]["status"] == "completed" and body["turn"]["final_answer"] == "Hello."
        assert body["events"][-1]["type"] == "final"
        assert fake.bodies[0]["model"] == "scripted-fake"  # resolved from GET /v1/models
        assert "tool_choice" not in fake.bodies[0]
