"""Cache hints from what really happens: the order in which the workbench tells the server
(the scripted fake records chat requests and bare POST /cache/hint calls in one timeline)."""

import pytest

from tests.app.support import decide, make_settings, new_session, post_turn, workbench_client
from tests.fakes.scripted_openai import ScriptedOpenAI, ScriptedReply, scripted_server, tool_call

pytestmark = pytest.mark.usefixtures("workbench_database")  # each test on SQLite and PostgreSQL

PROPOSAL = {"action": "restart_service", "target": "event-api", "reason": "queue stuck"}


def _answer(body):
    return ScriptedReply(content=f"answer to: {body['messages'][-1]['content']}")


def _states(fake, key):
    """What the server heard about `key`, in order: ("chat"|"hint", state, pin)."""
    return [(kind, hint.get("state"), hint.get("pin")) for kind, hint in fake.timeline
            if hint is not None and hint["session"] == key]


def _tools(fake, key: str) -> list:
    """What each tool_wait hint of `key` said it waits on."""
    return [hint.get("tool") for kind, hint in fake.timeline
            if hint is not None and hint["session"] == key and hint.get("state") == "tool_wait"]


def test_an_approval_waits_as_tool_wait_and_only_the_end_is_done(tmp_path):
    replies = [ScriptedReply(tool_calls=[tool_call("propose_action", PROPOSAL, "c1")]),
               ScriptedReply(content="Restart is up to you.")]
    with scripted_server(replies) as fake, workbench_client(make_settings(tmp_path, fake.base_url)) as client:
        session = new_session(client)
        key = f"{session['id']}/{session['active_branch_id']}"
        events = post_turn(client, session["id"], "Diagnose the service")
        assert events[-1]["type"] == "approval_request"
        # minutes may pass now: the server hears tool_wait, not the request's active, and no done
        assert _states(fake, key) == [("chat", "active", None), ("hint", "tool_wait", None)]

        rest = decide(client, events[-1]["approval_id"], approved=False)
        assert rest[-1]["type"] == "final"
        assert _states(fake, key)[2:] == [("hint", "tool_wait", None),  # the approval node, resumed
                                          ("hint", "tool_wait", None),  # the tools node
                                          ("chat", "active", None), ("hint", "done", None)]
        # the approval waits on a person, the tools node on the tool it runs: each timed apart by the server
        assert _tools(fake, key) == ["approval", "approval", "propose_action"]


def test_a_failed_turn_ends_with_done(tmp_path):
    with scripted_server([ScriptedReply(status=500)]) as fake, \
            workbench_client(make_settings(tmp_path, fake.base_url)) as client:
        session = new_session(client)
        key = f"{session['id']}/{session['active_branch_id']}"
        assert post_turn(client, session["id"], "hello")[-1]["type"] == "error"
        assert _states(fake, key) == [("chat", "active", None), ("hint", "done", None)]


def test_the_open_branch_is_pinned_one_at_a_time_and_keeps_its_pin_after_a_turn(tmp_path):
    with scripted_server(_answer) as fake, workbench_client(make_settings(tmp_path, fake.base_url)) as client:
        session = new_session(client)
        sid, main_id = session["id"], session["active_branch_id"]
        main = f"{sid}/{main_id}"
        assert client.post(f"/api/sessions/{sid}/branches/{main_id}/open").status_code == 204
        turn = post_turn(client, sid, "first")[-1]["turn_id"]
        # the user still looks at main: its finished turn is done, and stays pinned
        assert _states(fake, main) == [("hint", None, True), ("chat", "active", None), ("hint", "done", True)]

        alt = client.post(f"/api/sessions/{sid}/branches", json={"turn_id": turn, "name": "alt"}).json()
        alt_key = f"{sid}/{alt['id']}"
        assert client.post(f"/api/sessions/{sid}/branches/{alt['id']}/open").status_code == 204
        assert fake.timeline[-2:] == [("hint", {"session": main, "pin": False}),
                                      ("hint", {"session": alt_key, "pin": True})]
        post_turn(client, sid, "on main again", branch_id=main_id)
        assert _states(fake, main)[-1] == ("hint", "done", None), "main is no longer pinned: a plain release"

        other = client.get(f"/api/sessions/{sid}/branches/{alt['id']}/open")
        assert other.status_code == 405
        unknown = client.post(f"/api/sessions/{sid}/branches/nope/open")
        assert unknown.status_code == 404 and len(fake.hints) == 5  # nothing sent for it


def test_deleting_a_session_releases_every_branch(tmp_path):
    with scripted_server(_answer) as fake, workbench_client(make_settings(tmp_path, fake.base_url)) as client:
        session = new_session(client)
        sid, main_id = session["id"], session["active_branch_id"]
        turn = post_turn(client, sid, "first")[-1]["turn_id"]
        alt = client.post(f"/api/sessions/{sid}/branches", json={"turn_id": turn}).json()
        client.post(f"/api/sessions/{sid}/branches/{alt['id']}/open")
        before = len(fake.hints)
        assert client.delete(f"/api/sessions/{sid}").status_code == 204
        assert sorted(fake.hints[before:], key=lambda h: h["session"]) == sorted(
            [{"session": f"{sid}/{main_id}", "state": "done"}, {"session": f"{sid}/{alt['id']}", "state": "done"}],
            key=lambda h: h["session"])
        # the deleted branch was the pinned one: a later open pins without unpinning a ghost
        other = new_session(client)
        client.post(f"/api/sessions/{other['id']}/branches/{other['active_branch_id']}/open")
        assert fake.hints[-1] == {"session": f"{other['id']}/{other['active_branch_id']}", "pin": True}
        assert len(fake.hints) == before + 3


def test_the_workbench_unpins_its_branch_when_it_stops(tmp_path):
    with scripted_server(_answer) as fake:
        with workbench_client(make_settings(tmp_path, fake.base_url)) as client:
            session = new_session(client)
            client.post(f"/api/sessions/{session['id']}/branches/{session['active_branch_id']}/open")
        key = f"{session['id']}/{session['active_branch_id']}"
        assert fake.hints == [{"session": key, "pin": True}, {"session": key, "pin": False}]


def test_a_server_without_the_hint_endpoint_is_asked_once(tmp_path):
    fake = ScriptedOpenAI(_answer, hint_endpoint=False)
    with fake, workbench_client(make_settings(tmp_path, fake.base_url)) as client:
        session = new_session(client)
        for message in ("one", "two"):
            assert post_turn(client, session["id"], message)[-1]["type"] == "final"
        assert fake.hint_refusals == 1
        assert all(b["cache"]["state"] == "active" for b in fake.bodies), "request hints still ride along"
