"""POST /api/turns/{id}/cancel stops a running turn (its model request is closed) and leaves the
branch at its last completed turn; GET /api/turns/{id}/events replays a turn's events and
follows it live. Over real HTTP: the workbench under uvicorn, the scripted model server."""

from __future__ import annotations

import json
import time

import httpx
import pytest

from app.main import create_app
from tests.app.support import SseReader, lab_catalog, live_server, make_settings
from tests.fakes.scripted_openai import ScriptedOpenAI, ScriptedReply, tool_call
from tests.workbench_auth import AUTH_HEADERS

pytestmark = [pytest.mark.usefixtures("workbench_database"), pytest.mark.timeout(120)]

LONG = " ".join(f"word{i}" for i in range(400))  # 400 chunks, 50 ms apart: 20 s unless stopped


def _script(body: dict) -> ScriptedReply:
    user = [m for m in body["messages"] if m["role"] == "user"][-1]["content"]
    if user == "long":
        return ScriptedReply(content=LONG, token_delay_s=0.05)
    if user == "propose":
        if body["messages"][-1]["role"] == "tool":
            return ScriptedReply(content="Proposal noted.")
        return ScriptedReply(tool_calls=[tool_call("propose_action", {"action": "restart_service",
                                                                      "target": "api", "reason": "stuck"}, "p1")])
    return ScriptedReply(content=f"Answer to {user}.")


def _tokens(events: list[dict]) -> int:
    return sum(1 for e in events if e["type"] == "token")


def _text(events: list[dict]) -> str:
    return "".join(e["text"] for e in events if e["type"] == "token")


@pytest.fixture
def stack(tmp_path):
    fake = ScriptedOpenAI(_script).start()
    try:
        with live_server(create_app(make_settings(tmp_path, fake.base_url), lab_catalog())) as url:
            yield fake, url
    finally:
        fake.stop()


def test_cancel_closes_the_model_request_and_the_branch_goes_on_from_its_last_turn(stack):
    fake, url = stack
    api = httpx.Client(base_url=url, timeout=30, headers=AUTH_HEADERS)
    sid = api.post("/api/sessions", json={"scenario": "lab"}).json()["id"]
    t1 = api.post(f"/api/sessions/{sid}/turns", json={"message": "first", "stream": False}).json()["turn"]["id"]

    poster = SseReader("POST", f"{url}/api/sessions/{sid}/turns", json={"message": "long"})
    poster.start()
    poster.wait_for(lambda events: _tokens(events) >= 3, "streamed tokens")
    turn_id = poster.events[0]["turn_id"]
    assert api.get(f"/api/turns/{turn_id}").json()["status"] == "running"

    # a second reader (a reloaded page) gets what was streamed so far, then follows live
    rejoined = SseReader("GET", f"{url}/api/turns/{turn_id}/events")
    rejoined.start()
    rejoined.wait_for(lambda events: _tokens(events) >= _tokens(poster.events[:4]) + 2, "replayed and new tokens")
    assert rejoined.events[0] == poster.events[0]

    stopped = api.post(f"/api/turns/{turn_id}/cancel")
    assert stopped.status_code == 200, stopped.text
    assert stopped.json()["status"] == "cancelled" and "stopped by the user" in stopped.json()["error"]
    poster.join(10)
    rejoined.join(10)
    assert not poster.is_alive() and not rejoined.is_alive()
    assert poster.events[-1]["type"] == "cancelled" and rejoined.events == poster.events  # one log, two readers
    assert 3 <= _tokens(poster.events) < 400
    deadline = time.monotonic() + 10
    while fake.aborted < 1:  # the model server saw its client leave mid-stream
        assert time.monotonic() < deadline, "the model request was not closed"
        time.sleep(0.05)
    assert fake.hints[-1]["state"] == "done"  # and then heard that the branch is done with

    detail = api.get(f"/api/sessions/{sid}").json()
    main = next(b for b in detail["branches"] if b["id"] == detail["active_branch_id"])
    assert main["head_turn_id"] == t1  # the cancelled turn never became the head
    after = api.post(f"/api/sessions/{sid}/turns", json={"message": "after", "stream": False})
    assert after.status_code == 200, after.text
    assert after.json()["turn"]["status"] == "completed" and after.json()["turn"]["parent_turn_id"] == t1
    sent = [(m["role"], m["content"]) for m in fake.bodies[-1]["messages"][1:]]
    assert sent == [("user", "first"), ("assistant", "Answer to first."), ("user", "after")]

    # an ended turn: replayed from its journal (tokens merged into fewer events); it cannot be stopped again
    replay = api.get(f"/api/turns/{turn_id}/events")
    events = [json.loads(line[5:]) for line in replay.text.splitlines() if line.startswith("data:")]
    assert events[0] == poster.events[0] and events[-1] == poster.events[-1]
    assert _text(events) == _text(poster.events) and len(events) < len(poster.events)
    again = api.post(f"/api/turns/{turn_id}/cancel")
    assert again.status_code == 409 and again.json()["error"]["type"] == "turn_not_running"
    assert api.post("/api/turns/nope/cancel").status_code == 404
    assert api.get("/api/turns/nope/events").status_code == 404


def test_a_turn_waiting_for_approval_is_cancelled_with_its_approval(stack):
    fake, url = stack
    api = httpx.Client(base_url=url, timeout=30, headers=AUTH_HEADERS)
    sid = api.post("/api/sessions", json={"scenario": "lab"}).json()["id"]
    paused = api.post(f"/api/sessions/{sid}/turns", json={"message": "propose", "stream": False}).json()
    assert paused["turn"]["status"] == "awaiting_approval"
    approval_id = paused["events"][-1]["approval_id"]
    replay = api.get(f"/api/turns/{paused['turn']['id']}/events").text
    assert '"type": "approval_request"' in replay and approval_id in replay

    stopped = api.post(f"/api/turns/{paused['turn']['id']}/cancel")
    assert stopped.status_code == 200 and stopped.json()["status"] == "cancelled"
    assert api.get(f"/api/approvals/{approval_id}").json()["status"] == "cancelled"
    replay = api.get(f"/api/turns/{paused['turn']['id']}/events").text  # the journal tells the cancel too
    types = [json.loads(line[5:])["type"] for line in replay.splitlines() if line.startswith("data:")]
    assert types[-2:] == ["approval_request", "cancelled"], types
    assert fake.hints[-1]["state"] == "done"  # the server hears the branch is done with
    late = api.post(f"/api/approvals/{approval_id}", json={"approved": True, "stream": False})
    assert late.status_code == 409 and late.json()["error"]["type"] == "approval_decided"
    after = api.post(f"/api/sessions/{sid}/turns", json={"message": "after", "stream": False}).json()
    assert after["turn"]["status"] == "completed" and after["turn"]["parent_turn_id"] is None
    assert [m["role"] for m in fake.bodies[-1]["messages"]] == ["system", "user"]
