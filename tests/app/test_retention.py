"""Retention (issue 35, item 8): `prune` clears old span bodies, deletes old turn events and the
checkpoints inside old turns, keeps every checkpoint the turn tree points to, and never touches a
paused turn; the branch goes on after it. `arbor prune` and the workbench's periodic job run it.
On SQLite and PostgreSQL, with the scripted fake (app/services/retention.py)."""

from __future__ import annotations

import time
from datetime import timedelta

import pytest
from sqlmodel import Session, select

from app.cli import main
from app.db.models import Span, Turn, TurnEvent, utcnow
from app.services.retention import PruneReport, RetentionPolicy, prune
from tests.app.support import make_settings, new_session, parse_sse, post_turn, workbench_client
from tests.fakes.scripted_openai import ScriptedReply, scripted_server, tool_call

pytestmark = [pytest.mark.usefixtures("workbench_database"), pytest.mark.timeout(120)]

PROPOSAL = {"action": "restart_service", "target": "api", "reason": "stuck"}


def _model(body: dict) -> ScriptedReply:
    user = [m for m in body["messages"] if m["role"] == "user"][-1]["content"]
    if body["messages"][-1]["role"] == "tool":
        return ScriptedReply(content=f"Done with {user}.")
    if user == "propose":
        return ScriptedReply(tool_calls=[tool_call("propose_action", PROPOSAL, "p1")])
    return ScriptedReply(tool_calls=[tool_call("echo", {"text": user}, "e1")])


def _spans(engine, turn_id: str) -> list[Span]:
    with Session(engine) as db:
        return list(db.exec(select(Span).where(Span.turn_id == turn_id)).all())


def _events(engine, turn_id: str) -> int:
    with Session(engine) as db:
        return len(db.exec(select(TurnEvent).where(TurnEvent.turn_id == turn_id)).all())


def _journaled(engine, turn_id: str) -> int:
    """The turn's event count once its journal has reached the database: the journal writes in
    batches (ARBOR_EVENT_FLUSH_S), so the last events land a moment after the answer."""
    deadline = time.monotonic() + 10
    while not (count := _events(engine, turn_id)):
        assert time.monotonic() < deadline, "the turn's events never reached the database"
        time.sleep(0.05)
    return count


def _checkpoints_of(client, sid: str, branch_id: str, turn_id: str) -> set[str]:
    listed = client.get(f"/api/sessions/{sid}/branches/{branch_id}/checkpoints").json()
    return {c["checkpoint_id"] for c in listed if c["turn_id"] == turn_id}


def test_prune_removes_what_aged_out_keeps_the_tree_and_spares_a_paused_turn(tmp_path):
    with scripted_server(_model) as fake, workbench_client(make_settings(tmp_path, fake.base_url)) as client:
        engine, settings = client.app.state.workbench.engine, client.app.state.workbench.settings
        session = new_session(client)
        sid, main_branch = session["id"], session["active_branch_id"]
        t1 = post_turn(client, sid, "first")[-1]["turn_id"]  # a tool call: checkpoints inside it
        alt = client.post(f"/api/sessions/{sid}/branches", json={"turn_id": t1, "name": "alt"}).json()["id"]
        paused = post_turn(client, sid, "propose", branch_id=alt)[-1]
        assert paused["type"] == "approval_request"
        t1_row = client.get(f"/api/turns/{t1}").json()
        inside = _checkpoints_of(client, sid, main_branch, t1)
        assert t1_row["end_checkpoint_id"] in inside and len(inside) >= 3
        paused_bodies = [(s.request, s.response) for s in _spans(engine, paused["turn_id"])]
        spans = len(_spans(engine, t1))
        assert spans == 3  # model (the tool call), tool, model (the answer)

        assert prune(engine, settings) == PruneReport(), "nothing is 30 days old yet"
        later = utcnow() + timedelta(days=60)
        report = prune(engine, settings, now=later)
        assert report.span_bodies == spans and report.turn_events > 0
        assert report.checkpoints >= len(inside) - 1  # all but its end (and its input checkpoint, not listed)

        pruned = _spans(engine, t1)  # the rows stay, with their figures; the bodies go
        assert [(s.request, s.response) for s in pruned] == [(None, None)] * spans
        assert all(s.attributes and s.duration_ms is not None for s in pruned)
        assert _events(engine, t1) == 0
        assert _checkpoints_of(client, sid, main_branch, t1) == {t1_row["end_checkpoint_id"]}
        # the paused turn keeps everything, and its branch's thread is left whole
        assert [(s.request, s.response) for s in _spans(engine, paused["turn_id"])] == paused_bodies
        assert _events(engine, paused["turn_id"]) > 0 and len(_checkpoints_of(client, sid, alt, paused["turn_id"])) > 0
        assert prune(engine, settings, now=later) == PruneReport(), "a second prune finds nothing"

        # the turn's replay is rebuilt from its row; the branch goes on from its end checkpoint
        replay = parse_sse(client.get(f"/api/turns/{t1}/events").text)
        assert [e["type"] for e in replay] == ["turn", "final"]
        assert post_turn(client, sid, "second", branch_id=main_branch)[-1]["type"] == "final"
        history = fake.bodies[-2]["messages"]  # the second turn's first call
        assert [m["content"] for m in history if m["role"] == "user"] == ["first", "second"]
        assert any(m["role"] == "tool" and "first" in m["content"] for m in history)
        fork = client.post(f"/api/sessions/{sid}/branches", json={"turn_id": t1})
        assert fork.status_code == 201, fork.text

        # the approval still resumes the paused turn
        done = client.post(f"/api/approvals/{paused['approval_id']}", json={"approved": True, "stream": False})
        assert done.json()["turn"]["status"] == "completed"


def test_zero_days_keeps_forever(tmp_path):
    with scripted_server(_model) as fake, workbench_client(make_settings(tmp_path, fake.base_url)) as client:
        engine, settings = client.app.state.workbench.engine, client.app.state.workbench.settings
        t1 = post_turn(client, new_session(client)["id"], "first")[-1]["turn_id"]
        events = _journaled(engine, t1)
        report = prune(engine, settings, RetentionPolicy(0, 0, 0), now=utcnow() + timedelta(days=3650))
        assert report == PruneReport()
        assert all(s.request is not None for s in _spans(engine, t1)) and _events(engine, t1) == events


def test_arbor_prune_prunes_now_and_reports(tmp_path, monkeypatch, capsys):
    with scripted_server(_model) as fake, workbench_client(make_settings(tmp_path, fake.base_url)) as client:
        engine = client.app.state.workbench.engine
        t1 = post_turn(client, new_session(client)["id"], "first")[-1]["turn_id"]
        _journaled(engine, t1)
        monkeypatch.chdir(tmp_path)  # no developer .env
        monkeypatch.setenv("ARBOR_DATA_DIR", str(tmp_path / "var"))
        assert main(["prune"]) == 0
        assert "span bodies cleared: 0 (older than 30 days)" in capsys.readouterr().out
        time.sleep(0.2)  # 1e-6 days is 86 ms
        assert main(["prune", "--traces-days", "1e-6", "--turn-events-days", "0", "--checkpoints-days", "1e-6"]) == 0
        out = capsys.readouterr().out
        assert "span bodies cleared: 3 (older than 1e-06 days)" in out
        assert "turn events deleted: 0 (kept forever)" in out and "checkpoints deleted: 0 " not in out
        assert all(s.request is None for s in _spans(engine, t1)) and _events(engine, t1) > 0
        assert main(["prune", "--traces-days", "-1"]) == 2


def test_the_running_workbench_prunes_periodically(tmp_path):
    with scripted_server(_model) as fake:
        settings = make_settings(tmp_path, fake.base_url, retain_traces_days=1e-6, retain_turn_events_days=1e-6,
                                 prune_interval_s=0.2)
        with workbench_client(settings) as client:
            workbench = client.app.state.workbench
            t1 = post_turn(client, new_session(client)["id"], "first")[-1]["turn_id"]
            deadline = time.monotonic() + 30
            # done when the job has cleared bodies and deleted events (so the journal had reached
            # the database) and nothing of either is left
            while not (any(r.span_bodies for r in workbench.pruning.reports)
                       and any(r.turn_events for r in workbench.pruning.reports)
                       and all(s.request is None for s in _spans(workbench.engine, t1))
                       and _events(workbench.engine, t1) == 0):
                assert time.monotonic() < deadline, "the periodic prune did not run"
                time.sleep(0.05)
        assert workbench.pruning.task is None, "stopped with the workbench"
        with Session(workbench.engine) as db:
            assert db.get(Turn, t1).status == "completed"
