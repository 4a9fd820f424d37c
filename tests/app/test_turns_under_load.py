"""No 5xx under load (issue 59, item 3): new turns, approvals and cancels, sent at once by several
clients through several workbench processes (`arbor serve`: two on one PostgreSQL; one on SQLite,
which serves one process per database file), on the same branches.

Every answer is a 2xx or the 409 that says why not (branch busy, approval decided or stale, turn
not running or still starting); never a 5xx (the suite's guard, tests/app/server_errors.py, would
fail the test too). Afterwards nothing is lost or left half-done: every turn a client was told
about is in the database, and nothing else is; each ended completed or cancelled, none still
running or paused, no approval pending; an approval cancelled belongs to a cancelled turn and a
completed turn's approval was decided; each branch's turns form one chain (every turn's parent
is the branch's last completed turn before it) whose end is the branch head; and the next turn
starts from exactly that history (the user messages of the completed turns, in order, in its
model request: the LangGraph thread agrees with the tables).

The races it found have a test each below: a cancel of a paused turn whose journal was still
being written (the 500 of issue 59: both wrote the same row number), a second cancel of a turn
that was recording the first (its task died unrecorded, the turn stayed running), a turn started
just as the one before completed (it read the old branch head).
"""

from __future__ import annotations

import asyncio
import json
import random
import threading
import time
from contextlib import ExitStack
from pathlib import Path

import httpx
import pytest
from sqlmodel import Session, col, select

from app.db.models import TurnEvent
from app.services import turn_journal
from app.services.turn_log import TurnHandle
from tests.app.processes import workbench
from tests.app.support import make_settings, new_session, post_turn, workbench_client
from tests.fakes.scripted_openai import ScriptedReply, scripted_server, tool_call
from tests.workbench_auth import AUTH_HEADERS

pytestmark = pytest.mark.timeout(300)

SESSIONS = 2
CLIENTS_PER_SESSION = 3
LOAD_S = 15.0  # how long the clients keep sending
REFUSALS = {"branch_busy", "approval_decided", "approval_stale", "turn_not_running", "turn_starting"}


def _reply(body: dict) -> ScriptedReply:
    """A turn whose message says "propose" proposes an action (it pauses for the operator);
    every other model step answers. Each call takes a few tens of milliseconds: turns overlap."""
    last = body["messages"][-1]
    delay = random.uniform(0.02, 0.25)
    if last["role"] == "user" and "propose" in str(last["content"]):
        return ScriptedReply(tool_calls=[tool_call("propose_action", {
            "action": "restart_service", "target": "edge-event-api", "reason": str(last["content"])})],
            delay_s=delay)
    return ScriptedReply(content=f"done: {str(last.get('content'))[:40]}", delay_s=delay)


class Load:
    """What the clients did: every answer (for the checks) and the turns they were told about."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.answers: list[tuple[str, int, str]] = []  # (what, status, error type or "")
        self.turns: set[str] = set()
        self.problems: list[str] = []

    def answer(self, what: str, response: httpx.Response) -> dict:
        body: dict = {}
        try:
            body = response.json()
        except ValueError:
            pass
        error = ""
        if response.status_code >= 300 and isinstance(body, dict) and isinstance(body.get("error"), dict):
            error = body["error"].get("type", "")
        with self.lock:
            self.answers.append((what, response.status_code, error))
            if response.status_code >= 500 or (response.status_code >= 300 and error not in REFUSALS):
                self.problems.append(f"{what} -> {response.status_code} {response.text[:300]}")
        return body if response.status_code < 300 else {}


def _client(load: Load, urls: list[str], session_id: str, name: str, seed: int, deadline: float) -> None:
    rng = random.Random(seed)
    http = httpx.Client(timeout=120, headers=AUTH_HEADERS)
    n = 0
    try:
        while time.monotonic() < deadline:
            url = rng.choice(urls)
            op = rng.choices(("turn", "decide", "cancel"), (4, 3, 2))[0]
            if op == "turn":
                n += 1
                message = f"{'propose' if rng.random() < 0.6 else 'ask'} {name}-{n}"
                _turn(load, http, url, session_id, message, stream=rng.random() < 0.5)
            elif op == "decide":
                pending = http.get(f"{url}/api/approvals", params={"session_id": session_id}).json()
                if pending:
                    approval = rng.choice(pending)["id"]
                    load.answer("decide", http.post(f"{url}/api/approvals/{approval}",
                                                    json={"approved": rng.random() < 0.5, "stream": False}))
            else:
                active = [t for t in http.get(f"{url}/api/sessions/{session_id}").json()["turns"]
                          if t["status"] in ("running", "awaiting_approval")]
                if active:
                    load.answer("cancel", http.post(f"{url}/api/turns/{active[-1]['id']}/cancel"))
            time.sleep(rng.uniform(0, 0.1))
    except Exception as exc:  # noqa: BLE001  (whatever stops a client is a problem the test reports)
        with load.lock:
            load.problems.append(f"{name}: {type(exc).__name__}: {exc}")
    finally:
        http.close()


def _turn(load: Load, http: httpx.Client, url: str, session_id: str, message: str, stream: bool) -> None:
    path = f"{url}/api/sessions/{session_id}/turns"
    if not stream:
        body = load.answer("turn", http.post(path, json={"message": message, "stream": False}))
        if body:
            with load.lock:
                load.turns.add(body["turn"]["id"])
        return
    with http.stream("POST", path, json={"message": message}) as response:
        if response.status_code != 200:
            response.read()
            load.answer("turn", response)
            return
        events = [json.loads(line[5:]) for line in response.iter_lines() if line.startswith("data:")]
    with load.lock:
        load.answers.append(("turn", 200, ""))
        load.turns.add(events[0]["turn_id"])
        if events[-1]["type"] not in ("final", "approval_request", "cancelled"):
            load.problems.append(f"a streamed turn ended with {events[-1]}")


def _settle(urls: list[str], session_id: str) -> None:
    """Cancel what is still paused or running (a cancel may meet a turn just starting: 409, again)."""
    deadline = time.monotonic() + 60
    while True:
        turns = httpx.get(f"{urls[0]}/api/sessions/{session_id}", headers=AUTH_HEADERS, timeout=30).json()["turns"]
        active = [t for t in turns if t["status"] in ("running", "awaiting_approval")]
        if not active:
            return
        assert time.monotonic() < deadline, f"turns still active after the load: {active}"
        for turn in active:
            r = httpx.post(f"{urls[-1]}/api/turns/{turn['id']}/cancel", headers=AUTH_HEADERS, timeout=60)
            assert r.status_code in (200, 409), r.text
        time.sleep(0.2)


def _check_session(url: str, session_id: str, told: set[str], fake_requests: list[dict]) -> int:
    detail = httpx.get(f"{url}/api/sessions/{session_id}", headers=AUTH_HEADERS, timeout=30).json()
    turns = detail["turns"]
    assert {t["id"] for t in turns} == told, "every turn a client was told about is there, and no other"
    assert {t["status"] for t in turns} <= {"completed", "cancelled"}, \
        [(t["id"], t["status"], t["error"]) for t in turns if t["status"] not in ("completed", "cancelled")]
    approvals = httpx.get(f"{url}/api/approvals", params={"session_id": session_id, "status": ""},
                          headers=AUTH_HEADERS, timeout=30).json()
    status = {t["id"]: t["status"] for t in turns}
    for approval in approvals:
        assert approval["status"] != "pending", approval
        if approval["status"] == "cancelled":
            assert status[approval["turn_id"]] == "cancelled", (approval, status[approval["turn_id"]])
        if status[approval["turn_id"]] == "completed":
            assert approval["status"] in ("approved", "rejected"), approval

    (branch,) = detail["branches"]
    last_completed = None
    chain: list[str] = []
    for turn in sorted(turns, key=lambda t: t["created_at"]):
        assert turn["parent_turn_id"] == last_completed, ("a turn starts from the branch's last completed turn",
                                                          turn, last_completed)
        if turn["status"] == "completed":
            last_completed = turn["id"]
            chain.append(turn["user_message"])
    assert branch["head_turn_id"] == last_completed

    # the next turn starts from that history, and only that
    message = f"ask final {session_id}"
    final = httpx.post(f"{url}/api/sessions/{session_id}/turns", json={"message": message, "stream": False},
                       headers=AUTH_HEADERS, timeout=60)
    assert final.status_code == 200 and final.json()["turn"]["status"] == "completed", final.text
    sent = next(r["body"]["messages"] for r in fake_requests if r["body"]["messages"][-1].get("content") == message)
    assert [m["content"] for m in sent if m["role"] == "user"] == [*chain, message]
    return len(turns)


def test_turns_approvals_and_cancels_at_once_answer_no_5xx_and_lose_nothing(tmp_path: Path, workbench_database):
    database_url = (workbench_database.cluster.url(workbench_database.name) if workbench_database.cluster
                    else f"sqlite:///{tmp_path / 'arbor.db'}")
    processes = 2 if workbench_database.kind == "postgresql" else 1
    with scripted_server(_reply) as fake, ExitStack() as stack:
        urls = [stack.enter_context(workbench(tmp_path, f"w{i}", database_url, fake.base_url))[0]
                for i in range(processes)]
        sessions = []
        for _ in range(SESSIONS):
            r = httpx.post(f"{urls[0]}/api/sessions", json={"scenario": "edge_incident"}, headers=AUTH_HEADERS,
                           timeout=30)
            assert r.status_code == 201, r.text
            sessions.append(r.json()["id"])
        load = Load()
        deadline = time.monotonic() + LOAD_S
        threads = [threading.Thread(target=_client, args=(load, urls, session_id, f"s{s}c{c}", 1000 * s + c, deadline))
                   for s, session_id in enumerate(sessions) for c in range(CLIENTS_PER_SESSION)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(timeout=200)
        assert not any(t.is_alive() for t in threads), "a client hung"
        assert not load.problems, "\n".join(load.problems[:20])
        done = {what: sum(1 for w, s, _ in load.answers if w == what and s == 200) for what in ("turn", "decide",
                                                                                                  "cancel")}
        assert done["turn"] >= 10 and done["decide"] >= 3 and done["cancel"] >= 3, (done, load.answers[:50])

        total = 0
        for session_id in sessions:
            _settle(urls, session_id)
            with load.lock:
                told = set(load.turns)
            detail = httpx.get(f"{urls[0]}/api/sessions/{session_id}", headers=AUTH_HEADERS, timeout=30).json()
            mine = told & {t["id"] for t in detail["turns"]}
            total += _check_session(urls[-1], session_id, mine, fake.requests)
        assert total == len(load.turns), "every turn told about belongs to one of the sessions"


def _slow_journal(monkeypatch: pytest.MonkeyPatch, hold_s: float) -> None:
    """Each journal batch holds its transaction open `hold_s` after its rows are inserted: the
    moment a loaded database takes to commit them."""
    def write(self, batch: list[dict], first_seq: int) -> None:
        with Session(self.engine) as db:
            for i, event in enumerate(batch):
                db.add(TurnEvent(**self.ids, seq=first_seq + i, type=str(event.get("type")), payload=event))
            db.flush()
            time.sleep(hold_s)
            db.commit()

    monkeypatch.setattr(turn_journal.TurnJournal, "_write", write)


@pytest.mark.usefixtures("workbench_database")
def test_a_paused_turn_is_cancelled_while_its_journal_is_still_being_written(tmp_path, monkeypatch):
    """The pause's event is written with the pause, after what the turn streamed before it; the
    cancel's event comes after both (it used to take the same row number: IntegrityError, 500)."""
    _slow_journal(monkeypatch, 0.4)
    replies = [ScriptedReply(tool_calls=[tool_call("propose_action", {
        "action": "restart_service", "target": "api", "reason": "stuck"}, "p1")])]
    with scripted_server(replies) as fake, workbench_client(make_settings(tmp_path, fake.base_url)) as client:
        session = new_session(client)
        paused = post_turn(client, session["id"], "propose")
        assert paused[-1]["type"] == "approval_request"
        stopped = client.post(f"/api/turns/{paused[-1]['turn_id']}/cancel")
        assert stopped.status_code == 200 and stopped.json()["status"] == "cancelled", stopped.text
        with Session(client.app.state.workbench.engine) as db:
            rows = db.exec(select(TurnEvent).where(TurnEvent.turn_id == paused[-1]["turn_id"])
                           .order_by(col(TurnEvent.seq))).all()
        assert [r.seq for r in rows] == list(range(len(rows)))
        assert [r.type for r in rows][-2:] == ["approval_request", "cancelled"]
        assert rows[0].type == "turn"


async def test_a_second_cancel_does_not_cut_short_the_recording_of_the_first():
    """Two Stops at once: the first cancels the task, which then records the cancel; the second
    changes nothing (it used to cancel that recording: the turn stayed `running`, no event)."""
    recorded: list[str] = []

    async def turn() -> None:
        try:
            await asyncio.sleep(30)  # the graph
        except asyncio.CancelledError:
            current = asyncio.current_task()
            assert current is not None
            current.uncancel()
            await asyncio.sleep(0.1)  # recording the cancel
            recorded.append("cancelled")

    handle = TurnHandle("t", "r")
    handle.task = asyncio.get_running_loop().create_task(turn())
    handle.phase = "graph"
    await asyncio.sleep(0)
    handle.request_cancel()
    await asyncio.sleep(0.02)
    handle.request_cancel()
    await handle.task
    assert recorded == ["cancelled"] and not handle.task.cancelled()


async def test_a_cancel_asked_before_the_graph_runs_is_asked_once():
    """A Stop before the task reaches the graph marks the handle; a second Stop, once the task
    runs and is recording that cancel, must not cancel it again."""
    handle = TurnHandle("t", "r")
    handle.task = asyncio.get_running_loop().create_task(asyncio.sleep(0.2))
    handle.request_cancel()  # phase "starting": noted, nothing cancelled
    assert handle.cancel_requested and not handle.task.cancelled()
    handle.phase = "graph"
    handle.request_cancel()
    await asyncio.sleep(0)
    assert not handle.task.cancelled() and not handle.task.done()
    await handle.task
