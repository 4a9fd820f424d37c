"""POST /api/turns/{id}/retry: a failed turn's message runs again as a new turn on the same
branch, from the same parent, with the same options; anything else is a 409 that says why."""

from tests.app.support import make_settings, new_session, of_type, parse_sse, post_turn, workbench_client
from tests.fakes.scripted_openai import ScriptedReply, scripted_server, tool_call


def test_a_failed_turn_is_retried_as_a_new_turn_from_the_same_parent(tmp_path):
    replies = [ScriptedReply(content="First answer."),
               ScriptedReply(status=503),  # the backend fails the second turn
               ScriptedReply(tool_calls=[tool_call("echo", {"text": "again"}, "c1")]),
               ScriptedReply(content="Second answer, on the retry.")]
    with scripted_server(replies) as fake, workbench_client(make_settings(tmp_path, fake.base_url)) as client:
        sid = new_session(client)["id"]
        t1 = post_turn(client, sid, "first")[-1]["turn_id"]
        failed = post_turn(client, sid, "second", force_tool=True)
        assert failed[-1]["type"] == "error" and failed[-1]["retryable"] is True
        t2 = failed[0]["turn_id"]

        response = client.post(f"/api/turns/{t2}/retry")
        assert response.status_code == 200, response.text
        events = parse_sse(response.text)
        assert events[0]["type"] == "turn" and events[0]["retry_of"] == t2
        assert events[0]["parent_turn_id"] == t1 and events[-1]["type"] == "final"
        assert events[-1]["content"] == "Second answer, on the retry."
        t3 = events[0]["turn_id"]
        # the same message and the same options: force_tool made the first step require a tool
        assert fake.bodies[2]["messages"][-1] == {"role": "user", "content": "second"}
        assert fake.bodies[2]["tool_choice"] == "required"
        assert [m["content"] for m in fake.bodies[2]["messages"] if m["role"] == "user"] == ["first", "second"]
        assert of_type(events, "tool_result")[0]["name"] == "echo"

        detail = client.get(f"/api/sessions/{sid}").json()
        by_id = {t["id"]: t for t in detail["turns"]}
        assert by_id[t2]["status"] == "failed" and by_id[t3]["status"] == "completed"
        assert by_id[t3]["parent_turn_id"] == t1 and by_id[t3]["user_message"] == "second"
        main = next(b for b in detail["branches"] if b["id"] == detail["active_branch_id"])
        assert main["head_turn_id"] == t3

        again = client.post(f"/api/turns/{t2}/retry")  # the branch has moved on: fork instead
        assert again.status_code == 409 and again.json()["error"]["type"] == "branch_moved"
        assert t1 in again.json()["error"]["message"]
        done = client.post(f"/api/turns/{t3}/retry")
        assert done.status_code == 409 and done.json()["error"]["type"] == "turn_not_failed"
        assert client.post("/api/turns/nope/retry").status_code == 404


def test_retry_answers_json_when_asked(tmp_path):
    replies = [ScriptedReply(status=500), ScriptedReply(content="Fine now.")]
    with scripted_server(replies) as fake, workbench_client(make_settings(tmp_path, fake.base_url)) as client:
        sid = new_session(client)["id"]
        t1 = post_turn(client, sid, "hello")[0]["turn_id"]
        response = client.post(f"/api/turns/{t1}/retry", json={"stream": False})
        assert response.status_code == 200, response.text
        body = response.json()
        assert body["turn"]["status"] == "completed" and body["turn"]["user_message"] == "hello"
        assert body["turn"]["parent_turn_id"] is None and body["events"][0]["retry_of"] == t1
        assert len(fake.bodies) == 2
