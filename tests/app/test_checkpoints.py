"""LangGraph checkpoints live where DATABASE_URL says, one thread per branch, and are deleted
with their session."""

import pytest

from tests.app.support import make_settings, new_session, post_turn, workbench_client
from tests.fakes.scripted_openai import ScriptedReply, scripted_server, tool_call

PROPOSAL = {"action": "rollback_release", "target": "event-api", "reason": "bad deploy"}


def _reply(body):
    """Propose an action when asked to, answer otherwise (also after a tool result)."""
    last = body["messages"][-1]
    if last["role"] == "user" and "propose" in last["content"]:
        return ScriptedReply(tool_calls=[tool_call("propose_action", PROPOSAL, "p1")])
    return ScriptedReply(content="done")


def _thread(branch_id: str) -> str:
    return f"branch-{branch_id}"  # one LangGraph thread per branch (app/services/turns.py)


def test_deleting_a_session_deletes_its_checkpoints(tmp_path, workbench_database):
    settings = make_settings(tmp_path, "http://placeholder/v1")
    with scripted_server(_reply) as fake, \
            workbench_client(settings.model_copy(update={"llm_base_url": fake.base_url})) as client:
        doomed, kept = new_session(client), new_session(client)
        answered = post_turn(client, doomed["id"], "hello")[-1]
        fork = client.post(f"/api/sessions/{doomed['id']}/branches", json={"turn_id": answered["turn_id"]}).json()
        paused = post_turn(client, doomed["id"], "please propose a rollback")[-1]  # on the fork
        assert answered["type"] == "final" and paused["type"] == "approval_request"
        post_turn(client, kept["id"], "hello")
        threads = {_thread(doomed["active_branch_id"]), _thread(fork["id"]), _thread(kept["active_branch_id"])}
        assert workbench_database.checkpoint_threads(settings) == threads

        # a paused turn does not keep its session: the session goes, with every thread of it
        assert client.delete(f"/api/sessions/{doomed['id']}").status_code == 204
        assert workbench_database.checkpoint_threads(settings) == {_thread(kept["active_branch_id"])}
        assert client.get(f"/api/approvals/{paused['approval_id']}").status_code == 404

        # the other session is untouched and goes on
        assert post_turn(client, kept["id"], "and again")[-1]["type"] == "final"
        assert workbench_database.checkpoint_threads(settings) == {_thread(kept["active_branch_id"])}
    if workbench_database.kind == "postgresql":
        # in the PostgreSQL database itself: no SQLite file appears beside the data
        assert settings.checkpoint_path is None
        assert not list(settings.data_dir.glob("*.sqlite")) and not list(settings.data_dir.glob("*.db"))


@pytest.mark.expects_5xx  # the injected checkpoint failure answers 500
def test_a_failed_checkpoint_delete_leaves_the_session_whole_and_can_be_retried(tmp_path):
    with scripted_server(_reply) as fake, workbench_client(make_settings(tmp_path, fake.base_url)) as client:
        session = new_session(client)
        post_turn(client, session["id"], "hello")
        checkpointer = client.app.state.workbench.checkpointer
        real_delete = checkpointer.adelete_thread

        async def broken(thread_id):
            raise RuntimeError("checkpoint store unavailable")

        checkpointer.adelete_thread = broken
        assert client.delete(f"/api/sessions/{session['id']}").status_code == 500
        detail = client.get(f"/api/sessions/{session['id']}")
        assert detail.status_code == 200 and len(detail.json()["turns"]) == 1

        checkpointer.adelete_thread = real_delete
        assert client.delete(f"/api/sessions/{session['id']}").status_code == 204
        assert client.get(f"/api/sessions/{session['id']}").status_code == 404
