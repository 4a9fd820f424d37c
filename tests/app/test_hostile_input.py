"""Hostile requests against a live workbench (uvicorn on loopback, on SQLite and on PostgreSQL, scripted
model backend): each gets a 4xx with a readable error, the server keeps answering, and every
session reads back exactly as before. Markup in stored fields is kept verbatim and only ever
served as JSON; concurrent sends on one branch run one turn and refuse the others."""

from __future__ import annotations

import threading
from dataclasses import dataclass

import httpx
import pytest

from app.main import create_app
from tests.app.support import lab_catalog, live_server, make_settings
from tests.fakes.scripted_openai import ScriptedReply, scripted_server, tool_call
from tests.workbench_auth import AUTH_HEADERS

MAX_CHARS = 500  # make_settings' max_message_chars
PROPOSAL = {"action": "restart_service", "target": "api", "reason": "stuck"}
MARKUP = '<script>alert(1)</script><img src=x onerror="alert(2)">&amp;"\''


def reply(body: dict) -> ScriptedReply:
    last = body["messages"][-1]
    if last["role"] == "user" and "propose" in str(last["content"]):
        return ScriptedReply(tool_calls=[tool_call("propose_action", PROPOSAL, "p1")])
    return ScriptedReply(content="ok", delay_s=0.5)


@dataclass
class World:
    """A session with a completed turn, one waiting for an approval, one approval already decided,
    and the ids of a deleted session."""

    url: str
    session: str
    branch: str
    turn: str
    waiting_session: str
    pending_approval: str
    decided_approval: str
    deleted_session: str
    deleted_branch: str
    deleted_turn: str


def _turn(client: httpx.Client, session: str, message: str) -> dict:
    r = client.post(f"/api/sessions/{session}/turns", json={"message": message, "stream": False})
    assert r.status_code == 200, r.text
    return r.json()


def _new(client: httpx.Client) -> dict:
    r = client.post("/api/sessions", json={"scenario": "lab"})
    assert r.status_code == 201, r.text
    return r.json()


def _approval(client: httpx.Client, session: str) -> str:
    return client.get("/api/approvals", params={"session_id": session}).json()[0]["id"]


@pytest.fixture(scope="module")
def world(tmp_path_factory, module_database):  # the whole module once per database
    with scripted_server(reply) as fake:
        app = create_app(make_settings(tmp_path_factory.mktemp("wb"), fake.base_url), lab_catalog())
        with live_server(app) as url, httpx.Client(base_url=url, timeout=60, headers=AUTH_HEADERS) as client:
            main = _new(client)
            done = _turn(client, main["id"], "hello")["turn"]
            waiting = _new(client)
            _turn(client, waiting["id"], "please propose")
            decided = _new(client)
            _turn(client, decided["id"], "please propose")
            decided_approval = _approval(client, decided["id"])
            r = client.post(f"/api/approvals/{decided_approval}", json={"approved": False, "stream": False})
            assert r.status_code == 200, r.text
            gone = _new(client)
            gone_turn = _turn(client, gone["id"], "hello")["turn"]
            assert client.delete(f"/api/sessions/{gone['id']}").status_code == 204
            yield client, World(url, main["id"], done["branch_id"], done["id"], waiting["id"],
                                _approval(client, waiting["id"]), decided_approval, gone["id"], gone_turn["branch_id"],
                                gone_turn["id"])


def raw(body: bytes) -> dict:
    return {"content": body, "headers": {"content-type": "application/json"}}


# (name, request made from the World: (method, path, httpx kwargs), status, error type)
HOSTILE = [
    ("message over the limit", lambda w: ("POST", f"/api/sessions/{w.session}/turns",
                                          {"json": {"message": "x" * (MAX_CHARS + 1)}}), 413, "message_too_long"),
    ("10 MB body", lambda w: ("POST", f"/api/sessions/{w.session}/turns",
                              {"json": {"message": "x" * 10 * 2**20}}), 413, "request_too_large"),
    ("lone surrogate in a message", lambda w: ("POST", f"/api/sessions/{w.session}/turns",
                                               raw(b'{"message": "hi \\ud800"}')), 400, "invalid_unicode"),
    ("lone surrogate in a title", lambda w: ("PATCH", f"/api/sessions/{w.session}", raw(b'{"title": "\\udfff"}')),
     400, "invalid_unicode"),
    ("lone surrogate in tool arguments", lambda w: ("POST", "/api/scenarios/lab/tools/echo",
                                                    raw(b'{"arguments": {"text": "\\ud800"}}')),
     400, "invalid_unicode"),
    ("lone surrogate in an approval comment", lambda w: ("POST", f"/api/approvals/{w.pending_approval}",
                                                         raw(b'{"approved": true, "comment": "\\ud800"}')), 400,
     "invalid_unicode"),
    ("JSON nested 20000 deep", lambda w: ("POST", f"/api/sessions/{w.session}/turns",
                                          raw(b'{"message": "x", "x": ' + b"[" * 20000 + b"]" * 20000 + b"}")), 400,
     "invalid_request"),
    ("body a JSON array", lambda w: ("POST", f"/api/sessions/{w.session}/turns", raw(b"[1]")), 422, "invalid_request"),
    ("message missing", lambda w: ("POST", f"/api/sessions/{w.session}/turns", {"json": {}}), 422, "invalid_request"),
    ("blank message", lambda w: ("POST", f"/api/sessions/{w.session}/turns", {"json": {"message": " \n\t "}}), 422,
     "empty_message"),
    ("unknown session", lambda w: ("GET", "/api/sessions/nope", {}), 404, "unknown_session"),
    ("10000-character session id", lambda w: ("GET", "/api/sessions/" + "a" * 10000, {}), 404, "unknown_session"),
    ("turn on an unknown branch", lambda w: ("POST", f"/api/sessions/{w.session}/turns",
                                             {"json": {"message": "hi", "branch_id": "nope"}}), 404, "unknown_branch"),
    ("turn on another session's branch", lambda w: ("POST", f"/api/sessions/{w.waiting_session}/turns",
                                                    {"json": {"message": "hi", "branch_id": w.branch}}), 400,
     "branch_not_in_session"),
    ("turn on a deleted session's branch", lambda w: ("POST", f"/api/sessions/{w.session}/turns",
                                                      {"json": {"message": "hi", "branch_id": w.deleted_branch}}), 404,
     "unknown_branch"),
    ("turn in a deleted session", lambda w: ("POST", f"/api/sessions/{w.deleted_session}/turns",
                                             {"json": {"message": "hi"}}), 404, "unknown_session"),
    ("fork from an unknown turn", lambda w: ("POST", f"/api/sessions/{w.session}/branches",
                                             {"json": {"turn_id": "nope"}}), 404, "unknown_turn"),
    ("fork in a deleted session", lambda w: ("POST", f"/api/sessions/{w.deleted_session}/branches",
                                             {"json": {"turn_id": w.deleted_turn}}), 404, "unknown_session"),
    ("fork from a deleted session's turn", lambda w: ("POST", f"/api/sessions/{w.session}/branches",
                                                      {"json": {"turn_id": w.deleted_turn}}), 404, "unknown_turn"),
    ("fork from another session's turn", lambda w: ("POST", f"/api/sessions/{w.waiting_session}/branches",
                                                    {"json": {"turn_id": w.turn}}), 400, "turn_not_in_session"),
    ("switch to an unknown branch", lambda w: ("PATCH", f"/api/sessions/{w.session}",
                                               {"json": {"active_branch_id": "nope"}}), 404, "unknown_branch"),
    ("title over 200 characters", lambda w: ("PATCH", f"/api/sessions/{w.session}", {"json": {"title": "t" * 201}}),
     422, "invalid_request"),
    ("send while an approval waits", lambda w: ("POST", f"/api/sessions/{w.waiting_session}/turns",
                                                {"json": {"message": "and now?"}}), 409, "branch_busy"),
    ("approval replayed", lambda w: ("POST", f"/api/approvals/{w.decided_approval}", {"json": {"approved": True}}),
     409, "approval_decided"),
    ("unknown approval", lambda w: ("POST", "/api/approvals/nope", {"json": {"approved": True}}), 404,
     "unknown_approval"),
    ("approval decision not a boolean", lambda w: ("POST", f"/api/approvals/{w.pending_approval}",
                                                   {"json": {"approved": "maybe"}}), 422, "invalid_request"),
    ("unknown tool_choice", lambda w: ("POST", f"/api/sessions/{w.session}/turns",
                                       {"json": {"message": "hi", "tool_choice": "sometimes"}}), 422,
     "invalid_tool_choice"),
    ("unknown scenario", lambda w: ("POST", "/api/sessions", {"json": {"scenario": "<b>nope</b>"}}), 404,
     "unknown_scenario"),
    ("unknown tool", lambda w: ("POST", "/api/scenarios/lab/tools/nope", {"json": {}}), 404, "unknown_tool"),
    ("proposed action run directly", lambda w: ("POST", "/api/scenarios/lab/tools/propose_action",
                                                {"json": {"arguments": PROPOSAL}}), 409, "requires_approval"),
    ("path traversal as an artifact id", lambda w: ("GET", "/api/artifacts/..%2F..%2Fetc%2Fpasswd", {}), 404, None),
    ("wrong method", lambda w: ("PUT", f"/api/sessions/{w.session}", {"json": {}}), 405, "method_not_allowed"),
]


def snapshot(client: httpx.Client) -> list[dict]:
    sessions = client.get("/api/sessions").json()
    return [client.get(f"/api/sessions/{s['id']}").json() for s in sessions]


def test_there_are_at_least_20_hostile_kinds():
    assert len({name for name, *_ in HOSTILE}) >= 20


@pytest.mark.parametrize("name,make,status,error_type", HOSTILE, ids=[c[0] for c in HOSTILE])
def test_hostile_request_is_refused_cleanly(world, name, make, status, error_type):
    client, w = world
    before = snapshot(client)
    method, path, kwargs = make(w)
    r = client.request(method, path, **kwargs)
    assert r.status_code == status, r.text[:2000]
    assert r.headers["content-type"].startswith("application/json")
    error = r.json()["error"]
    assert isinstance(error["message"], str) and 5 < len(error["message"]) < 2000, error
    if error_type is not None:
        assert error["type"] == error_type, error
    assert client.get("/api/health").status_code == 200
    assert snapshot(client) == before


def test_markup_in_stored_fields_is_kept_verbatim_and_served_as_json(world):
    client, w = world
    session = client.post("/api/sessions", json={"scenario": "lab", "title": MARKUP}).json()
    assert session["title"] == MARKUP
    turn = _turn(client, session["id"], MARKUP)["turn"]
    branch = client.post(f"/api/sessions/{session['id']}/branches", json={"turn_id": turn["id"], "name": MARKUP})
    assert branch.status_code == 201 and branch.json()["name"] == MARKUP
    tool = client.post("/api/scenarios/lab/tools/echo", json={"arguments": {"text": MARKUP}})
    assert tool.status_code == 200 and tool.json()["result"] == {"echo": MARKUP}
    for path in (f"/api/sessions/{session['id']}", f"/api/turns/{turn['id']}", f"/api/sessions/{session['id']}/trace"):
        r = client.get(path)
        assert r.status_code == 200 and r.headers["content-type"].startswith("application/json"), path
    detail = client.get(f"/api/sessions/{session['id']}").json()
    assert detail["title"] == MARKUP and detail["turns"][0]["user_message"] == MARKUP
    assert {b["name"] for b in detail["branches"]} >= {MARKUP}


def test_concurrent_sends_on_one_branch_run_one_turn(world):
    client, w = world
    session = _new(client)
    results: list[httpx.Response] = []
    lock = threading.Lock()

    def send(i: int):
        with httpx.Client(base_url=w.url, timeout=60, headers=AUTH_HEADERS) as own:
            r = own.post(f"/api/sessions/{session['id']}/turns", json={"message": f"hello {i}", "stream": False})
        with lock:
            results.append(r)

    threads = [threading.Thread(target=send, args=(i,)) for i in range(6)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    codes = sorted(r.status_code for r in results)
    assert codes.count(200) >= 1 and set(codes) <= {200, 409}, [r.text for r in results]
    assert all(r.json()["error"]["type"] == "branch_busy" for r in results if r.status_code == 409)
    detail = client.get(f"/api/sessions/{session['id']}").json()
    assert [t["status"] for t in detail["turns"]] == ["completed"] * codes.count(200)
    # the turns that ran are a chain on the branch, not siblings that lost each other
    assert detail["branches"][0]["head_turn_id"] == detail["turns"][-1]["id"]
