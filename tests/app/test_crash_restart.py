"""kill -9 the real workbench (`arbor serve`, a subprocess on a SQLite data dir) and start it
again on the same data dir (issue 14, crash and restart). The model is the scripted fake,
served from this process over real HTTP, so the kill can land at a known point.

- During a turn (the model call hangs): sessions, branches, completed turns and their trace
  spans come back exactly as they were; the interrupted turn is failed with a readable
  reason; retrying it sends the model the very request the killed turn had sent.
- During an approval wait: the turn stays paused, its approval pending; the decision
  resumes the run from the LangGraph checkpoint (no model call is repeated).
- During an approval wait, with the checkpoint file lost as well: the turn is failed, its
  approval expired, and the turn can be retried.
See app/services/recovery.py for why a paused turn stays resumable.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import httpx
import pytest

from app.agent.graph import NO_TOOL_NOTE
from app.services.recovery import INTERRUPTED, PAUSE_LOST
from tests.app.support import parse_sse
from tests.fakes.scripted_openai import ScriptedReply, free_port, scripted_server, tool_call
from tests.workbench_auth import AUTH_HEADERS, WORKBENCH_TOKEN

ROOT = Path(__file__).resolve().parents[2]
SCENARIO = "edge_incident"  # has propose_action, an approval-gated tool
PROPOSAL = {"action": "restart_service", "target": "edge-event-api", "reason": "the queue is stuck"}


@dataclass
class Workbench:
    url: str
    proc: subprocess.Popen
    log: Path

    def get(self, path: str, **kw) -> httpx.Response:
        return httpx.get(self.url + path, timeout=60, headers=AUTH_HEADERS, **kw)

    def post(self, path: str, **kw) -> httpx.Response:
        return httpx.post(self.url + path, timeout=60, headers=AUTH_HEADERS, **kw)


def start_workbench(data_dir: Path, llm_url: str, log: Path) -> Workbench:
    """`arbor serve` on a free port; its settings from the environment only (no .env)."""
    port = free_port()
    env = {k: v for k, v in os.environ.items() if not k.startswith(("LLM_", "ARBOR_", "DATABASE_URL"))}
    env.update(PYTHONPATH=str(ROOT), ARBOR_DATA_DIR=str(data_dir), LLM_BASE_URL=llm_url, LLM_TIMEOUT_S="60",
               ARBOR_WORKBENCH_TOKEN=WORKBENCH_TOKEN)
    proc = subprocess.Popen([sys.executable, "-m", "app.cli", "serve", "--port", str(port), "--log-level", "info"],
                            cwd=log.parent, env=env, stdout=log.open("a"), stderr=subprocess.STDOUT)
    wb = Workbench(f"http://127.0.0.1:{port}", proc, log)
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            pytest.fail(f"the workbench exited with {proc.returncode}:\n{log.read_text()[-3000:]}")
        with contextlib.suppress(httpx.HTTPError):
            if httpx.get(wb.url + "/api/health", timeout=5, headers=AUTH_HEADERS).status_code == 200:
                return wb
        time.sleep(0.2)
    pytest.fail(f"the workbench did not start:\n{log.read_text()[-3000:]}")


def kill9(wb: Workbench) -> None:
    os.kill(wb.proc.pid, signal.SIGKILL)
    wb.proc.wait(timeout=30)
    assert wb.proc.returncode == -signal.SIGKILL


@contextlib.contextmanager
def workbench(data_dir: Path, llm_url: str, log: Path) -> Iterator[Workbench]:
    wb = start_workbench(data_dir, llm_url, log)
    try:
        yield wb
    finally:
        if wb.proc.poll() is None:
            wb.proc.terminate()
            try:
                wb.proc.wait(timeout=20)
            except subprocess.TimeoutExpired:
                wb.proc.kill()
                wb.proc.wait()


def run_turn(wb: Workbench, session_id: str, message: str, **fields) -> dict:
    r = wb.post(f"/api/sessions/{session_id}/turns", json={"message": message, "stream": False, **fields})
    assert r.status_code == 200, r.text
    return r.json()


def snapshot(wb: Workbench, session_id: str) -> dict:
    """What must survive a crash: the session list, the session (branches, turns, approvals)
    and its trace spans."""
    detail = wb.get(f"/api/sessions/{session_id}").json()
    spans = wb.get(f"/api/sessions/{session_id}/trace").json()["spans"]
    return {"sessions": wb.get("/api/sessions").json(), "branches": detail["branches"],
            "turns": {t["id"]: t for t in detail["turns"]}, "active_branch_id": detail["active_branch_id"],
            "spans": {s["id"]: s for s in spans}}


def wait_for(condition, what: str, timeout_s: float = 60) -> None:
    deadline = time.monotonic() + timeout_s
    while not condition():
        if time.monotonic() > deadline:
            pytest.fail(f"timed out waiting for {what}")
        time.sleep(0.02)


def test_kill_during_a_turn_then_restart_and_retry(tmp_path):
    replies = [ScriptedReply(content="The queue is normal."),
               ScriptedReply(content="The cache is warm."),
               ScriptedReply(content="never delivered", delay_s=8),  # the killed turn's model call hangs
               ScriptedReply(content="Recovered after the restart.")]
    data = tmp_path / "var"
    with scripted_server(replies) as fake:
        with workbench(data, fake.base_url, tmp_path / "wb.log") as wb:
            sid = wb.post("/api/sessions", json={"scenario": SCENARIO, "title": "crash test"}).json()["id"]
            t1 = run_turn(wb, sid, "How is the queue?")["turn"]["id"]
            alt = wb.post(f"/api/sessions/{sid}/branches", json={"turn_id": t1, "name": "alt"}).json()
            t2 = run_turn(wb, sid, "And the cache?")["turn"]["id"]  # on alt, the active branch
            before = snapshot(wb, sid)
            assert len(before["spans"]) >= 2

            events: list[dict] = []

            def stream_turn() -> None:
                buffer = ""
                with contextlib.suppress(httpx.HTTPError), httpx.stream(
                        "POST", f"{wb.url}/api/sessions/{sid}/turns", json={"message": "What next?"},
                        headers=AUTH_HEADERS, timeout=60) as r:
                    for text in r.iter_text():
                        *complete, buffer = (buffer + text).replace("\r\n", "\n").split("\n\n")
                        events.extend(e for block in complete for e in parse_sse(block))

            client = threading.Thread(target=stream_turn, daemon=True)
            client.start()
            wait_for(lambda: len(fake.requests) == 3, "the third turn's model call")
            kill9(wb)
            client.join(timeout=30)
            assert events and events[0]["type"] == "turn", "the turn had started"
            assert not [e for e in events if e["type"] in ("final", "error")], "and had not ended"
            t3 = events[0]["turn_id"]

        with workbench(data, fake.base_url, tmp_path / "wb.log") as wb:
            after = snapshot(wb, sid)
            assert after["sessions"] == before["sessions"], "no session is lost"
            assert after["branches"] == before["branches"] and after["active_branch_id"] == alt["id"]
            assert {k: after["turns"][k] for k in before["turns"]} == before["turns"]
            assert {k: after["spans"][k] for k in before["spans"]} == before["spans"], "the trace is intact"
            interrupted = after["turns"][t3]
            assert interrupted["status"] == "failed" and interrupted["error"] == INTERRUPTED
            assert interrupted["parent_turn_id"] == t2 and interrupted["finished_at"] is not None
            assert "workbench stopped" in wb.get(f"/api/turns/{t3}").json()["error"]

            r = wb.post(f"/api/turns/{t3}/retry", json={"stream": False})
            assert r.status_code == 200, r.text
            retried = r.json()
            assert retried["events"][0]["retry_of"] == t3
            assert retried["turn"]["status"] == "completed" and retried["turn"]["parent_turn_id"] == t2
            assert retried["turn"]["final_answer"] == "Recovered after the restart."
            # the retry sends the model exactly what the killed turn had sent
            assert fake.bodies[3]["messages"] == fake.bodies[2]["messages"]
            branches = {b["id"]: b for b in wb.get(f"/api/sessions/{sid}").json()["branches"]}
            assert branches[alt["id"]]["head_turn_id"] == retried["turn"]["id"]
            main = next(b for b in before["branches"] if b["id"] != alt["id"])
            assert branches[main["id"]]["head_turn_id"] == t1


def _paused_turn(wb: Workbench) -> tuple[str, dict]:
    sid = wb.post("/api/sessions", json={"scenario": SCENARIO}).json()["id"]
    body = run_turn(wb, sid, "The event queue is stuck; fix it.", force_tool=True)
    request = body["events"][-1]
    assert request["type"] == "approval_request" and request["arguments"] == PROPOSAL
    return sid, request


def test_kill_during_an_approval_wait_then_resume_from_the_checkpoint(tmp_path):
    replies = [ScriptedReply(tool_calls=[tool_call("propose_action", PROPOSAL, "c1")]),
               ScriptedReply(content="The operator approved the restart.")]
    data = tmp_path / "var"
    with scripted_server(replies) as fake:
        with workbench(data, fake.base_url, tmp_path / "wb.log") as wb:
            sid, request = _paused_turn(wb)
            before = snapshot(wb, sid)
            kill9(wb)

        with workbench(data, fake.base_url, tmp_path / "wb.log") as wb:
            after = snapshot(wb, sid)
            assert after["sessions"] == before["sessions"] and after["turns"] == before["turns"]
            assert after["spans"] == before["spans"]
            assert after["turns"][request["turn_id"]]["status"] == "awaiting_approval"
            pending = wb.get("/api/approvals", params={"session_id": sid}).json()
            assert [a["id"] for a in pending] == [request["approval_id"]]

            r = wb.post(f"/api/approvals/{request['approval_id']}", json={"approved": True, "stream": False})
            assert r.status_code == 200, r.text
            events = r.json()["events"]
            assert events[0]["resumed"] is True and events[-1]["type"] == "final"
            assert events[-1]["content"] == "The operator approved the restart."
            result = next(e for e in events if e["type"] == "tool_result")
            assert result["name"] == "propose_action" and "approved" in result["content"]
            assert r.json()["turn"]["status"] == "completed"
        # resumed from the checkpoint: the first model call was not made again
        assert len(fake.bodies) == 2
        assert fake.bodies[1]["messages"][-1]["tool_call_id"] == "c1"


def test_an_approval_whose_checkpoint_is_lost_is_expired_and_the_turn_retried(tmp_path):
    replies = [ScriptedReply(tool_calls=[tool_call("propose_action", PROPOSAL, "c1")]),
               ScriptedReply(content="Looked again: nothing to restart.")]
    data = tmp_path / "var"
    with scripted_server(replies) as fake:
        with workbench(data, fake.base_url, tmp_path / "wb.log") as wb:
            sid, request = _paused_turn(wb)
            kill9(wb)
        lost = list(data.glob("checkpoints.sqlite*"))
        assert lost, "the checkpointer keeps its own SQLite file"
        for path in lost:
            path.unlink()

        with workbench(data, fake.base_url, tmp_path / "wb.log") as wb:
            turn = wb.get(f"/api/turns/{request['turn_id']}").json()
            assert turn["status"] == "failed" and turn["error"] == PAUSE_LOST
            approval = wb.get(f"/api/approvals/{request['approval_id']}").json()
            assert approval["status"] == "expired"
            assert wb.get("/api/approvals", params={"session_id": sid}).json() == []
            decided = wb.post(f"/api/approvals/{request['approval_id']}", json={"approved": True})
            assert decided.status_code == 409
            r = wb.post(f"/api/turns/{request['turn_id']}/retry", json={"stream": False})
            assert r.status_code == 200, r.text
            # the retry forces its first step's tool call as the lost turn did; the script answers without one,
            # which the turn's answer says (app/agent/graph.py)
            assert fake.bodies[1]["tool_choice"] == fake.bodies[0]["tool_choice"] not in (None, "auto", "none")
            assert r.json()["turn"]["final_answer"] == f"Looked again: nothing to restart.\n\n{NO_TOOL_NOTE}"
            assert "paused turn" in (tmp_path / "wb.log").read_text()
