"""Sessions are trees of turns; a fork shares exactly the history up to its turn."""

import pytest

from tests.app.support import make_settings, new_session, post_turn, workbench_client
from tests.fakes.scripted_openai import ScriptedReply, scripted_server

pytestmark = pytest.mark.usefixtures("workbench_database")  # each test on SQLite and PostgreSQL


def _answer(body):
    return ScriptedReply(content=f"answer to: {body['messages'][-1]['content']}")


def test_fork_shares_history_up_to_the_turn_and_switching_is_cheap(tmp_path):
    with scripted_server(_answer) as fake, workbench_client(make_settings(tmp_path, fake.base_url)) as client:
        session = new_session(client)
        sid, main_id = session["id"], session["active_branch_id"]
        t1 = post_turn(client, sid, "first")[-1]["turn_id"]
        t2 = post_turn(client, sid, "second")[-1]["turn_id"]

        fork = client.post(f"/api/sessions/{sid}/branches", json={"turn_id": t1, "name": "alt"})
        assert fork.status_code == 201
        branch = fork.json()
        assert branch["head_turn_id"] == t1 and branch["fork_turn_id"] == t1 and branch["name"] == "alt"
        assert client.get(f"/api/sessions/{sid}").json()["active_branch_id"] == branch["id"]

        post_turn(client, sid, "alternative second")  # runs on the active (forked) branch
        main_body, fork_body = fake.bodies[1], fake.bodies[2]
        # the fork's request repeats main's request up to turn 1, then diverges
        shared = fake.bodies[0]["messages"] + [{"role": "assistant", "content": "answer to: first"}]
        assert fork_body["messages"][: len(shared)] == shared
        assert main_body["messages"][: len(shared)] == shared
        assert fork_body["messages"][len(shared)] == {"role": "user", "content": "alternative second"}
        assert fork_body["cache"]["session"] == f"{sid}/{branch['id']}"

        detail = client.get(f"/api/sessions/{sid}").json()
        by_id = {t["id"]: t for t in detail["turns"]}
        alt_turn = next(t for t in detail["turns"] if t["user_message"] == "alternative second")
        assert alt_turn["parent_turn_id"] == t1 and by_id[t2]["parent_turn_id"] == t1
        assert alt_turn["depth"] == by_id[t2]["depth"] == 1

        history = client.get(f"/api/sessions/{sid}/branches/{branch['id']}").json()
        assert [t["user_message"] for t in history["turns"]] == ["first", "alternative second"]
        main_history = client.get(f"/api/sessions/{sid}/branches/{main_id}").json()
        assert [t["user_message"] for t in main_history["turns"]] == ["first", "second"]

        switched = client.patch(f"/api/sessions/{sid}", json={"active_branch_id": main_id})
        assert switched.status_code == 200 and switched.json()["active_branch_id"] == main_id
        post_turn(client, sid, "third")
        assert [m["content"] for m in fake.bodies[-1]["messages"] if m["role"] == "user"] == [
            "first", "second", "third"]


def test_fork_errors(tmp_path):
    with scripted_server(_answer) as fake, workbench_client(make_settings(tmp_path, fake.base_url)) as client:
        a, b = new_session(client), new_session(client)
        turn_of_a = post_turn(client, a["id"], "hello")[-1]["turn_id"]

        other = client.post(f"/api/sessions/{b['id']}/branches", json={"turn_id": turn_of_a})
        assert other.status_code == 400
        assert other.json()["error"]["type"] == "turn_not_in_session"
        message = other.json()["error"]["message"]
        assert turn_of_a in message and a["id"] in message and b["id"] in message

        unknown = client.post(f"/api/sessions/{a['id']}/branches", json={"turn_id": "missing"})
        assert unknown.status_code == 404 and unknown.json()["error"]["type"] == "unknown_turn"

        no_session = client.post("/api/sessions/missing/branches", json={"turn_id": turn_of_a})
        assert no_session.status_code == 404 and no_session.json()["error"]["type"] == "unknown_session"

        bad_switch = client.patch(f"/api/sessions/{a['id']}", json={"active_branch_id": b["active_branch_id"]})
        assert bad_switch.status_code == 400 and bad_switch.json()["error"]["type"] == "branch_not_in_session"

        empty = client.post(f"/api/sessions/{a['id']}/branches", json={})
        assert empty.status_code == 201 and empty.json()["head_turn_id"] is None


def test_delete_session(tmp_path):
    with scripted_server(_answer) as fake, workbench_client(make_settings(tmp_path, fake.base_url)) as client:
        session = new_session(client)
        post_turn(client, session["id"], "hello")
        assert client.delete(f"/api/sessions/{session['id']}").status_code == 204
        assert client.get(f"/api/sessions/{session['id']}").status_code == 404
        assert client.get("/api/sessions").json() == []
