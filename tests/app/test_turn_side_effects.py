"""A turn's side effects follow the turn (issue 35, item 7): the chapter a story turn writes on
approval is staged, seen by that turn's own tools and by nobody else until the turn completes;
a turn that then fails or is cancelled (paused or running) takes it away, and its retry numbers
its chapter as if the failed turn never ran; a crash between the approved write and the turn's
end (kill -9 of `arbor serve`, as tests/app/test_crash_restart.py does) leaves no file after the
restart. With the scripted fake; in process on SQLite and PostgreSQL (app/services/workspace.py)."""

from __future__ import annotations

import sqlite3
from contextlib import closing

import httpx
import pytest
from sqlmodel import Session, select

from app.db.models import WorkspaceFile
from app.main import create_app
from app.scenario_catalog import ScenarioCatalog
from tests.app.support import (
    SseReader,
    decide,
    live_server,
    make_settings,
    new_session,
    of_type,
    post_turn,
    workbench_client,
)
from tests.app.test_crash_restart import kill9, run_turn, wait_for, workbench
from tests.fakes.scripted_openai import ScriptedOpenAI, ScriptedReply, scripted_server, tool_call
from tests.workbench_auth import AUTH_HEADERS

pytestmark = pytest.mark.timeout(120)
on_both_databases = pytest.mark.usefixtures("workbench_database")

CH3 = {"title": "第三章 来客", "text": "雾夜。苏晚敲响了灯塔的铁门。"}
CH4 = {"title": "第四章 风暴", "text": "风暴来了。"}


def _propose(chapter: dict, call_id: str) -> ScriptedReply:
    return ScriptedReply(tool_calls=[tool_call("append_chapter", chapter, call_id)])


def _rows(engine) -> list[WorkspaceFile]:
    with Session(engine) as db:
        return list(db.exec(select(WorkspaceFile)).all())


def _files(client, session: dict) -> list[dict]:
    response = client.get(f"/api/sessions/{session['id']}/branches/{session['active_branch_id']}/files",
                          params={"content": True})
    assert response.status_code == 200, response.text
    return response.json()


def _appended(events: list[dict]) -> str:
    return next(e for e in of_type(events, "tool_result") if e["name"] == "append_chapter")["content"]


@on_both_databases
def test_a_turn_that_fails_after_its_approved_write_leaves_no_chapter_and_the_retry_writes_the_same_number(
        tmp_path):
    replies = [_propose(CH3, "c1"),
               ScriptedReply(status=503),  # the model fails right after the chapter was written
               _propose(CH3, "c2"),  # the retry proposes it again
               ScriptedReply(content="第三章已提交。")]
    with scripted_server(replies) as fake, \
            workbench_client(make_settings(tmp_path, fake.base_url), ScenarioCatalog()) as client:
        engine = client.app.state.workbench.engine
        session = new_session(client, "story_writer")
        request = post_turn(client, session["id"], "写第三章")[-1]
        assert request["type"] == "approval_request"
        rest = decide(client, request["approval_id"], True)
        assert '"appended_chapter":3' in _appended(rest), "the write happened"
        assert rest[-1]["type"] == "error" and rest[-1]["retryable"] is True
        assert _files(client, session) == [] and _rows(engine) == [], "and went with the failed turn"

        retried = client.post(f"/api/turns/{request['turn_id']}/retry")
        assert retried.status_code == 200, retried.text
        again = [e for e in retried.text.split("\n") if e.startswith("data:")]
        assert again and '"approval_request"' in again[-1]
        approval_id = client.get("/api/approvals", params={"session_id": session["id"]}).json()[0]["id"]
        done = decide(client, approval_id, True)
        assert '"appended_chapter":3' in _appended(done), "numbered as if the failed turn never ran"
        assert done[-1]["type"] == "final"
        [saved] = _files(client, session)
        assert saved["path"] == "story_writer/chapters/03.md" and saved["turn_id"] == done[-1]["turn_id"]
        assert [r.staged for r in _rows(engine)] == [None]


@on_both_databases
def test_a_staged_chapter_is_its_turns_alone_and_a_cancel_while_paused_removes_it(tmp_path):
    replies = [_propose(CH3, "c1"),
               ScriptedReply(tool_calls=[tool_call("list_chapters", {}, "c2")]),
               _propose(CH4, "c3"),  # a second approval: the turn pauses with chapter 3 staged
               ScriptedReply(tool_calls=[tool_call("list_chapters", {}, "c4")]),  # the next turn lists
               ScriptedReply(content="两章。")]
    with scripted_server(replies) as fake, \
            workbench_client(make_settings(tmp_path, fake.base_url, tool_result_max_chars=4000),
                             ScenarioCatalog()) as client:
        engine = client.app.state.workbench.engine
        session = new_session(client, "story_writer")
        request = post_turn(client, session["id"], "写第三章和第四章")[-1]
        rest = decide(client, request["approval_id"], True)
        listing = next(e for e in of_type(rest, "tool_result") if e["name"] == "list_chapters")["content"]
        assert '"number":3' in listing, "the turn's own tools see what it wrote"
        assert rest[-1]["type"] == "approval_request"
        assert _files(client, session) == [], "nobody else does while the turn has not completed"
        assert [(r.path, r.staged) for r in _rows(engine)] == [("story_writer/chapters/03.md", True)]

        stopped = client.post(f"/api/turns/{request['turn_id']}/cancel")
        assert stopped.status_code == 200 and stopped.json()["status"] == "cancelled"
        assert _rows(engine) == []
        later = post_turn(client, session["id"], "现在有几章？")
        assert '"number":3' not in of_type(later, "tool_result")[0]["content"]
        assert later[-1]["type"] == "final"


@on_both_databases
def test_a_running_turn_cancelled_after_its_approved_write_leaves_no_chapter(tmp_path):
    replies = [_propose(CH3, "c1"),
               ScriptedReply(content=" ".join(["字"] * 400), token_delay_s=0.05),  # 20 s of tokens unless stopped
               _propose(CH3, "c2"),
               ScriptedReply(content="第三章已提交。")]
    fake = ScriptedOpenAI(replies).start()
    try:
        app = create_app(make_settings(tmp_path, fake.base_url), ScenarioCatalog())
        with live_server(app) as url:
            api = httpx.Client(base_url=url, timeout=30, headers=AUTH_HEADERS)
            session = api.post("/api/sessions", json={"scenario": "story_writer"}).json()
            paused = api.post(f"/api/sessions/{session['id']}/turns", json={"message": "写第三章", "stream": False})
            request = paused.json()["events"][-1]
            assert request["type"] == "approval_request"
            resumed = SseReader("POST", f"{url}/api/approvals/{request['approval_id']}", json={"approved": True})
            resumed.start()
            resumed.wait_for(lambda events: len(of_type(events, "token")) >= 3, "tokens after the write")
            assert '"appended_chapter":3' in _appended(resumed.events)
            assert _rows(app.state.workbench.engine)[0].staged is True

            stopped = api.post(f"/api/turns/{request['turn_id']}/cancel")
            assert stopped.status_code == 200 and stopped.json()["status"] == "cancelled"
            resumed.join(timeout=30)
            assert _files(api, session) == [] and _rows(app.state.workbench.engine) == []

            retried = api.post(f"/api/turns/{request['turn_id']}/retry", json={"stream": False}).json()
            done = api.post(f"/api/approvals/{retried['events'][-1]['approval_id']}",
                            json={"approved": True, "stream": False}).json()
            assert '"appended_chapter":3' in _appended(done["events"])
            assert [f["path"] for f in _files(api, session)] == ["story_writer/chapters/03.md"]
    finally:
        fake.stop()


def _sqlite_rows(data_dir) -> list[tuple]:
    with closing(sqlite3.connect(data_dir / "arbor.db")) as conn:
        return conn.execute("SELECT path, staged FROM workspace_files").fetchall()


def test_a_crash_between_the_approved_write_and_the_turns_end_leaves_no_chapter(tmp_path):
    replies = [_propose(CH3, "c1"),
               ScriptedReply(content="never delivered", delay_s=8),  # the model call after the write hangs
               _propose(CH3, "c2"),
               ScriptedReply(content="第三章已提交。")]
    data = tmp_path / "var"
    with scripted_server(replies) as fake:
        with workbench(data, fake.base_url, tmp_path / "wb.log") as wb:
            session = wb.post("/api/sessions", json={"scenario": "story_writer"}).json()
            request = run_turn(wb, session["id"], "写第三章")["events"][-1]
            assert request["type"] == "approval_request"
            resumed = SseReader("POST", f"{wb.url}/api/approvals/{request['approval_id']}", json={"approved": True})
            resumed.start()
            wait_for(lambda: len(fake.requests) == 2, "the model call after the approved write")
            assert '"appended_chapter":3' in _appended(resumed.events)
            assert _sqlite_rows(data) == [("story_writer/chapters/03.md", 1)]  # written, staged
            assert _files(wb, session) == []
            kill9(wb)
            resumed.join(timeout=30)

        with workbench(data, fake.base_url, tmp_path / "wb.log") as wb:
            assert wb.get(f"/api/turns/{request['turn_id']}").json()["status"] == "failed"
            assert _files(wb, session) == [] and _sqlite_rows(data) == [], "recovery took the chapter away"
            retried = wb.post(f"/api/turns/{request['turn_id']}/retry", json={"stream": False}).json()
            done = wb.post(f"/api/approvals/{retried['events'][-1]['approval_id']}",
                           json={"approved": True, "stream": False}).json()
            assert '"appended_chapter":3' in _appended(done["events"]) and done["turn"]["status"] == "completed"
            assert [f["path"] for f in _files(wb, session)] == ["story_writer/chapters/03.md"]
