"""POST /cache/hint on the real server: lifecycle hints that no generation carries."""

from __future__ import annotations

import uuid

import httpx
import pytest

pytestmark = pytest.mark.model


def _hint(server, body=None, headers=None) -> httpx.Response:
    return httpx.post(server.base_url + "/cache/hint", json=body, headers=headers or {}, timeout=30)


def _lifecycle(server) -> dict:
    r = httpx.get(server.base_url + "/cache/stats", timeout=60)
    assert r.status_code == 200
    return r.json()


def _name(label: str) -> str:
    return f"{label}-{uuid.uuid4().hex[:8]}/main"  # the workbench's session/branch form


def test_a_bare_hint_changes_only_what_it_names(arbor_server):
    s = _name("bare")
    before = _lifecycle(arbor_server)["lifecycle"]
    r = _hint(arbor_server, {"session": s, "state": "tool_wait"})
    assert r.status_code == 200, r.text
    assert r.json() == {"session": s, "state": "tool_wait", "pinned": False, "known": True, "recorded": True}
    # headers work too; without a state the session keeps the one it has
    r = _hint(arbor_server, headers={"X-Arbor-Session": s, "X-Arbor-Cache-Pin": "true"})
    assert r.json()["state"] == "tool_wait" and r.json()["pinned"] is True
    after = _lifecycle(arbor_server)["lifecycle"]
    assert after["sessions"] == before["sessions"] + 1
    assert after["pinned"] == before["pinned"] + 1
    assert after["by_state"]["tool_wait"] == before["by_state"]["tool_wait"] + 1
    # done with pin keeps the pin (a finished turn the user looks at); done alone releases it
    assert _hint(arbor_server, {"session": s, "state": "done", "pin": True}).json()["pinned"] is True
    assert _hint(arbor_server, {"session": s}).json()["pinned"] is True, "naming nothing changes nothing"
    r = _hint(arbor_server, {"session": s, "state": "done"})
    assert r.json()["state"] == "done" and r.json()["pinned"] is False
    assert _lifecycle(arbor_server)["lifecycle"]["pinned"] == before["pinned"]


def test_releasing_a_session_the_server_never_saw_records_nothing(arbor_server):
    before = _lifecycle(arbor_server)["lifecycle"]["sessions"]
    for body in ({"session": _name("gone"), "state": "done"}, {"session": _name("gone"), "pin": False}):
        r = _hint(arbor_server, body)
        assert r.status_code == 200 and r.json()["known"] is False and r.json()["recorded"] is False
    assert _lifecycle(arbor_server)["lifecycle"]["sessions"] == before


def test_a_request_hint_and_a_bare_hint_meet_in_one_session(arbor_server):
    s = _name("chat")
    r = httpx.post(arbor_server.v1 + "/chat/completions", timeout=120, json={
        "messages": [{"role": "user", "content": "Say hi."}], "max_tokens": 1,
        "cache": {"session": s, "state": "active"}})
    assert r.status_code == 200, r.text
    # the request's hint was recorded when it ended: a stateless bare hint finds it active
    assert _hint(arbor_server, {"session": s}).json() == {
        "session": s, "state": "active", "pinned": False, "known": True, "recorded": True}
    assert _hint(arbor_server, {"session": s, "state": "tool_wait"}).json()["state"] == "tool_wait"


def test_a_bare_pin_keeps_the_next_request_resident(arbor_server):
    """A request of a pinned session publishes its whole prefix as resident (tier S), also when
    the pin came from a bare hint; the same kind of request without a pin publishes nothing."""
    def resident_publishes() -> int:
        return _lifecycle(arbor_server)["tiers"]["S"]["publishes"]

    def ask(session: str, words: str) -> None:
        # a system message of its own: no other slot or owner shares a prefix worth publishing
        r = httpx.post(arbor_server.v1 + "/chat/completions", timeout=300, json={
            "messages": [{"role": "system", "content": f"{words} " * 12},
                         {"role": "user", "content": "Answer in one word."}],
            "max_tokens": 2, "temperature": 0, "cache": {"session": session}})
        assert r.status_code == 200, r.text

    before = resident_publishes()
    ask(_name("plain"), f"Orchards {uuid.uuid4().hex[:6]} grow quietly near rivers")
    assert resident_publishes() == before, "an unpinned request with nothing shared publishes nothing"
    pinned = _name("pinned")
    assert _hint(arbor_server, {"session": pinned, "pin": True}).json()["pinned"] is True
    ask(pinned, f"Lanterns {uuid.uuid4().hex[:6]} glow softly above harbours")
    assert resident_publishes() == before + 1
    _hint(arbor_server, {"session": pinned, "state": "done"})


@pytest.mark.parametrize(("body", "headers", "param"), [
    ({"state": "done"}, None, "cache.state"),
    ({}, None, "session"),
    (None, None, "session"),
    ({"session": "s", "state": "sleeping"}, None, "cache.state"),
    ({"session": "s", "colour": "red"}, None, "cache"),
    ({"session": "s", "pin": "yes"}, None, "cache.pin"),
    (None, {"X-Arbor-Session": "s", "X-Arbor-Cache-State": "later"}, "X-Arbor-Cache-State"),
])
def test_bad_hints_are_refused_with_the_field(arbor_server, body, headers, param):
    r = _hint(arbor_server, body, headers)
    assert r.status_code == 400, r.text
    assert r.json()["error"]["param"] == param


def test_a_body_that_is_not_an_object_is_refused(arbor_server):
    for content in (b"[1, 2]", b"not json"):
        r = httpx.post(arbor_server.base_url + "/cache/hint", content=content,
                       headers={"Content-Type": "application/json"}, timeout=30)
        assert r.status_code == 400 and "JSON object" in r.json()["error"]["message"]


def test_a_tool_wait_that_names_its_tool_is_timed_by_that_tool(arbor_server):
    """A tool wait's hint may name its tool (in the request's hint, a bare hint or the X-Arbor-Cache-Tool
    header); once the tool has come back MIN_RETURNS (4) times, the predictor times its waits by it
    (`/cache/stats` `policy.predictor.tools_timed`). A tool named without a tool wait is refused."""
    def tools_timed() -> int:
        return _lifecycle(arbor_server)["policy"]["predictor"]["tools_timed"]

    session, tool = _name("tooled"), f"probe_{uuid.uuid4().hex[:8]}"

    def ask(cache: dict | None = None, headers: dict | None = None) -> None:
        r = httpx.post(arbor_server.v1 + "/completions", timeout=300, headers=headers or {}, json={
            "prompt": "Count: one two three", "max_tokens": 1, "temperature": 0, **({"cache": cache} if cache else {})})
        assert r.status_code == 200, r.text

    before = tools_timed()
    ask({"session": session, "state": "tool_wait", "tool": tool})
    ask({"session": session, "state": "tool_wait", "tool": tool})  # its arrival: the tool's first return
    ask(headers={"X-Arbor-Session": session, "X-Arbor-Cache-State": "tool_wait", "X-Arbor-Cache-Tool": tool})
    ask({"session": session, "state": "active"})
    assert tools_timed() == before, "three returns: not timed yet"
    assert _hint(arbor_server, {"session": session, "state": "tool_wait", "tool": tool}).status_code == 200
    ask({"session": session, "state": "done"})  # the fourth return, of the wait the bare hint began
    assert tools_timed() == before + 1
    r = _hint(arbor_server, {"session": session, "state": "done", "tool": tool})
    assert r.status_code == 400 and r.json()["error"]["param"] == "cache.tool", r.text
