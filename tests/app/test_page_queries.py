"""What the session page's data costs: a branch's history is one query however long it is, and
spans come without their request bodies unless asked (one span's body has its own endpoint)."""

from __future__ import annotations

import contextlib

import pytest
from sqlalchemy import event
from sqlmodel import Session

from app.db.engine import make_engine
from app.db.models import Turn
from app.services import sessions as sessions_service
from tests.app.support import make_settings, new_session, post_turn, workbench_client
from tests.fakes.scripted_openai import ScriptedReply, scripted_server, tool_call

pytestmark = pytest.mark.usefixtures("workbench_database")


@contextlib.contextmanager
def counted(engine):
    statements: list[str] = []

    def count(conn, cursor, statement, *args):
        statements.append(statement)

    event.listen(engine, "before_cursor_execute", count)
    try:
        yield statements
    finally:
        event.remove(engine, "before_cursor_execute", count)


def test_a_branch_history_is_one_query_however_long(tmp_path):
    engine = make_engine(make_settings(tmp_path, "http://127.0.0.1:9").database_url)
    with Session(engine) as db:
        session = sessions_service.create_session(db, "lab")
        branch = sessions_service.get_branch(db, session, None)
        parent, ids = None, []
        for depth in range(40):
            turn = Turn(session_id=session.id, branch_id=branch.id, parent_turn_id=parent, depth=depth,
                        user_message=f"q{depth}", status="completed",
                        messages=[{"role": "user", "content": f"q{depth}"},
                                  {"role": "assistant", "content": f"a{depth}"}])
            db.add(turn)
            db.flush()
            parent = turn.id
            ids.append(turn.id)
        branch.head_turn_id = parent
        db.add(branch)
        db.commit()
        for head in (ids[4], ids[-1]):
            db.expire_all()
            with counted(engine) as statements:
                path = sessions_service.path_to(db, head)
            assert [t.id for t in path] == ids[: ids.index(head) + 1]
            assert len(statements) == 1, statements
        db.expire_all()
        db.refresh(branch)  # the branch row is the caller's: only the history is counted
        with counted(engine) as statements:
            history = sessions_service.history(db, branch)
        assert len(statements) == 1 and [m["content"] for m in history][-2:] == ["q39", "a39"]
        assert sessions_service.path_to(db, None) == []
    engine.dispose()


def test_spans_without_bodies_and_one_span_with_its_body(tmp_path):
    replies = [ScriptedReply(tool_calls=[tool_call("echo", {"text": "hi"}, "c1")]), ScriptedReply(content="Done.")]
    with scripted_server(replies) as fake, workbench_client(make_settings(tmp_path, fake.base_url)) as client:
        sid = new_session(client)["id"]
        post_turn(client, sid, "hello")
        full = client.get(f"/api/sessions/{sid}/trace").json()
        light = client.get(f"/api/sessions/{sid}/trace", params={"bodies": "false"}).json()
        assert light["bodies"] is False and light["summary"] == full["summary"]
        assert [s["id"] for s in light["spans"]] == [s["id"] for s in full["spans"]]
        assert all(s["request"] is None for s in light["spans"])
        assert [s["response"] for s in light["spans"]] == [s["response"] for s in full["spans"]]
        model = [s for s in full["spans"] if s["kind"] == "model"]
        assert [s["request"] for s in model] == fake.bodies  # the full trace still carries them
        one = client.get(f"/api/spans/{model[1]['id']}").json()
        assert one == model[1] and one["request"]["messages"][-1]["role"] == "tool"
        missing = client.get("/api/spans/nope")
        assert missing.status_code == 404 and missing.json()["error"]["type"] == "unknown_span"
