"""Several workbench processes (`arbor serve`) on one real PostgreSQL.

- A branch's "turn running" lock is the database's (a unique partial index on turns): two
  processes asked at the same moment for a turn on one branch run one, and the other answers
  409 branch_busy; a decision on one approval is claimed in the database.
- A process starting up fails only the turns of dead processes: a turn another live process
  is running keeps running; one whose process was killed is failed, and its branch is free.
- A turn's events can be followed from any process (its journal in the database): live while
  it runs, replayed once it has ended; a follower whose turn's process dies is told so. A Stop
  sent to any process stops the turn (the running one cancels it; a dead one's turn ends).
"""

from __future__ import annotations

import json
import os
import signal
import threading
import time
from contextlib import ExitStack

import httpx
import pytest

from tests.app.processes import workbench
from tests.app.support import SseReader
from tests.fakes.scripted_openai import ScriptedReply, scripted_server
from tests.pg_cluster import TempCluster
from tests.workbench_auth import AUTH_HEADERS


@pytest.fixture
def database(postgres_cluster: TempCluster):
    name = postgres_cluster.create_database()
    try:
        yield postgres_cluster.url(name)
    finally:
        postgres_cluster.drop_database(name)


def _session(url: str) -> str:
    r = httpx.post(url + "/api/sessions", json={"scenario": "edge_incident"}, timeout=30, headers=AUTH_HEADERS)
    assert r.status_code == 201, r.text
    return r.json()["id"]


def _turn(url: str, session_id: str, message: str, out: list, timeout: float = 120) -> None:
    """POST a turn and wait for its end; the answer (or the transport error) goes to `out`."""
    try:
        out.append(httpx.post(f"{url}/api/sessions/{session_id}/turns", json={"message": message, "stream": False},
                              headers=AUTH_HEADERS,
                              timeout=timeout))
    except httpx.HTTPError as exc:  # the process was killed under it
        out.append(exc)


def _turns(url: str, session_id: str) -> list[dict]:
    return httpx.get(f"{url}/api/sessions/{session_id}", timeout=30, headers=AUTH_HEADERS).json()["turns"]


def _slow(delay_s: float):
    return lambda body: ScriptedReply(content="All gauges report.", delay_s=delay_s)


def test_two_processes_never_run_two_turns_on_one_branch(tmp_path, database):
    with scripted_server(_slow(1.5)) as fake, ExitStack() as stack:
        a, _ = stack.enter_context(workbench(tmp_path, "a", database, fake.base_url))
        b, _ = stack.enter_context(workbench(tmp_path, "b", database, fake.base_url))
        for _attempt in range(4):  # the same moment, on the same branch, through two processes
            session = _session(a)
            results: list[httpx.Response] = []
            threads = [threading.Thread(target=_turn, args=(url, session, f"check {i}", results))
                       for i, url in enumerate((a, b))]
            for t in threads:
                t.start()
            for t in threads:
                t.join()
            codes = sorted(r.status_code for r in results)
            assert codes == [200, 409], [r.text for r in results]
            refused = next(r for r in results if r.status_code == 409).json()["error"]
            assert refused["type"] == "branch_busy" and "already has a turn" in refused["message"], refused
            assert [t["status"] for t in _turns(b, session)] == ["completed"]


def test_a_starting_process_fails_only_the_turns_of_dead_ones(tmp_path, database):
    def reply(body: dict) -> ScriptedReply:  # a turn asking for it stays in its model call a minute
        slow = "slowly" in str(body["messages"][-1].get("content"))
        return ScriptedReply(content="All gauges report.", delay_s=60 if slow else 0.5)

    with scripted_server(reply) as fake, ExitStack() as stack:
        a, proc_a = stack.enter_context(workbench(tmp_path, "a", database, fake.base_url))
        session = _session(a)
        cut: list = []
        t = threading.Thread(target=_turn, args=(a, session, "check the gauges slowly", cut, 90), daemon=True)
        t.start()
        _wait(lambda: len(fake.requests) == 1)  # A's turn is in its model call
        # a second process starts while A's turn runs: it leaves that turn alone
        b, _ = stack.enter_context(workbench(tmp_path, "b", database, fake.base_url))
        assert [x["status"] for x in _turns(b, session)] == ["running"]

        # A dies (kill -9) in the middle of the turn: the next process to start fails it
        os.kill(proc_a.pid, signal.SIGKILL)
        proc_a.wait(timeout=10)
        assert _turns(b, session)[0]["status"] == "running"  # B looked only at its own start
        c, _ = stack.enter_context(workbench(tmp_path, "c", database, fake.base_url))
        failed = _turns(c, session)[0]
        assert failed["status"] == "failed" and "stopped while this turn was running" in failed["error"], failed
        # and the branch is free again, through any process
        after: list = []
        _turn(b, session, "once more", after)
        assert after[0].status_code == 200 and _turns(c, session)[-1]["status"] == "completed", after[0]


def _wait(cond, timeout_s: float = 30.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not cond():
        assert time.monotonic() < deadline, "condition never held"
        time.sleep(0.1)


LONG = " ".join(f"gauge{i}" for i in range(120))  # 120 chunks 50 ms apart: a turn of about 6 s


def _tokens(events: list[dict]) -> list[str]:
    return [e["text"] for e in events if e["type"] == "token"]


def test_a_turn_is_followed_and_stopped_from_another_process(tmp_path, database):
    def reply(body: dict) -> ScriptedReply:
        return ScriptedReply(content=LONG, token_delay_s=0.05)

    with scripted_server(reply) as fake, ExitStack() as stack:
        a, proc_a = stack.enter_context(workbench(tmp_path, "a", database, fake.base_url))
        b, _ = stack.enter_context(workbench(tmp_path, "b", database, fake.base_url))
        session = _session(a)
        poster = SseReader("POST", f"{a}/api/sessions/{session}/turns", json={"message": "read every gauge"})
        poster.start()
        poster.wait_for(lambda events: len(_tokens(events)) >= 3, "tokens from A")
        turn_id = poster.events[0]["turn_id"]

        # B does not run the turn; it follows it from the database, while it runs
        follower = SseReader("GET", f"{b}/api/turns/{turn_id}/events")
        follower.start()
        follower.wait_for(lambda events: len(_tokens(events)) >= 1, "tokens through B")
        seen_running = httpx.get(f"{b}/api/turns/{turn_id}", timeout=10, headers=AUTH_HEADERS).json()["status"]
        poster.join(60)
        follower.join(60)
        assert not poster.is_alive() and not follower.is_alive() and follower.error is None
        assert seen_running == "running"  # B streamed tokens before the turn ended: live, not a replay
        assert follower.events[0] == poster.events[0] and follower.events[-1] == poster.events[-1]
        assert follower.events[-1]["type"] == "final"
        assert "".join(_tokens(follower.events)) == "".join(_tokens(poster.events)) == LONG
        assert [e["type"] for e in follower.events if e["type"] != "token"] == \
            [e["type"] for e in poster.events if e["type"] != "token"]

        # once it has ended, either process replays it whole
        for url in (a, b):
            replay = httpx.get(f"{url}/api/turns/{turn_id}/events", timeout=30, headers=AUTH_HEADERS)
            events = [json.loads(line[5:]) for line in replay.text.splitlines() if line.startswith("data:")]
            assert "".join(_tokens(events)) == LONG and events[-1] == poster.events[-1]

        # a Stop sent to B stops the turn A runs: A cancels it (closing its model request)
        poster = SseReader("POST", f"{a}/api/sessions/{session}/turns", json={"message": "and again"})
        poster.start()
        poster.wait_for(lambda events: len(_tokens(events)) >= 3, "tokens from A")
        stopped = httpx.post(f"{b}/api/turns/{poster.events[0]['turn_id']}/cancel", timeout=60, headers=AUTH_HEADERS)
        assert stopped.status_code == 200 and stopped.json()["status"] == "cancelled", stopped.text
        poster.join(30)
        assert poster.events[-1]["type"] == "cancelled" and len(_tokens(poster.events)) < 120
        _wait(lambda: fake.aborted >= 1)  # the model server saw A's request closed

        # a fourth turn: its process is killed under it, and B's follower is told so
        poster = SseReader("POST", f"{a}/api/sessions/{session}/turns", json={"message": "once more"})
        poster.start()
        poster.wait_for(lambda events: len(_tokens(events)) >= 3, "tokens from A")
        follower = SseReader("GET", f"{b}/api/turns/{poster.events[0]['turn_id']}/events")
        follower.start()
        follower.wait_for(lambda events: len(_tokens(events)) >= 1, "tokens through B")
        os.kill(proc_a.pid, signal.SIGKILL)
        proc_a.wait(timeout=10)
        follower.join(30)
        assert not follower.is_alive() and follower.error is None
        assert follower.events[-1]["type"] == "error" and follower.events[-1]["error_type"] == "process_lost"
        assert 1 <= len(_tokens(follower.events)) < 120
        # nobody runs it now: a Stop through B ends it at once, and the branch is free again
        lost = poster.events[0]["turn_id"]
        stopped = httpx.post(f"{b}/api/turns/{lost}/cancel", timeout=30, headers=AUTH_HEADERS)
        assert stopped.status_code == 200 and stopped.json()["status"] == "cancelled", stopped.text
        after: list = []
        _turn(b, session, "after the crash", after)
        assert after[0].status_code == 200 and after[0].json()["turn"]["status"] == "completed", after[0].text
