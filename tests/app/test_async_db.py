"""No database statement runs on the event loop: turns (tool loop, approval, failure), traces,
previews and deletes do their SQL in worker threads, so one slow write never stalls every
stream the workbench serves."""

import asyncio
import threading

import pytest
from sqlalchemy import event

from tests.app.support import decide, make_settings, new_session, post_turn, workbench_client
from tests.fakes.scripted_openai import ScriptedReply, scripted_server, tool_call

pytestmark = pytest.mark.usefixtures("workbench_database")  # each test on SQLite and PostgreSQL

PROPOSAL = {"action": "restart_service", "target": "event-api", "reason": "queue stuck"}


def _on_event_loop() -> bool:
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        return False
    return True


@pytest.mark.expects_5xx  # the failed backend's turn answers 502
def test_database_work_stays_off_the_event_loop(tmp_path):
    replies = [ScriptedReply(tool_calls=[tool_call("echo", {"text": "ping"}, "c1")]),
               ScriptedReply(tool_calls=[tool_call("propose_action", PROPOSAL, "c2")]),
               ScriptedReply(content="Done."),
               ScriptedReply(status=500)]
    with scripted_server(replies) as fake, workbench_client(make_settings(tmp_path, fake.base_url)) as client:
        engine = client.app.state.workbench.engine
        on_loop: list[str] = []
        seen = {"statements": 0}

        def check(conn, cursor, statement, *args):
            seen["statements"] += 1
            if _on_event_loop():
                on_loop.append(f"{threading.current_thread().name}: {statement[:80]}")

        event.listen(engine, "before_cursor_execute", check)
        try:
            session = new_session(client)
            events = post_turn(client, session["id"], "Echo ping please", force_tool=True)
            assert events[-1]["type"] == "approval_request"
            assert decide(client, events[-1]["approval_id"], approved=True)[-1]["type"] == "final"
            failed = client.post(f"/api/sessions/{session['id']}/turns", json={"message": "again", "stream": False})
            assert failed.status_code == 502
            assert client.post(f"/api/sessions/{session['id']}/preview", json={"message": "hi"}).status_code == 200
            assert client.get("/api/health").status_code == 200
            assert client.delete(f"/api/sessions/{session['id']}").status_code == 204
        finally:
            event.remove(engine, "before_cursor_execute", check)
        assert seen["statements"] > 20, "the listener saw the workbench's statements"
        assert on_loop == []
