"""Branches own their files (issue 26): a chapter approved on a fork is the fork's alone; a
fork starts from its parent's files at the fork point (a turn's end or a checkpoint inside a
turn); deleting a branch or the session removes its files. On SQLite and PostgreSQL, through
the workbench with the scripted fake (app/services/workspace.py)."""

import pytest
from sqlmodel import Session, select

from app.db.models import WorkspaceFile
from app.scenario_catalog import ScenarioCatalog
from tests.app.support import decide, make_settings, new_session, of_type, post_turn, workbench_client
from tests.fakes.scripted_openai import ScriptedReply, scripted_server, tool_call

pytestmark = pytest.mark.usefixtures("workbench_database")


def _reply(body):
    """"write <title>" proposes that chapter; "list" lists the chapters; anything else is answered."""
    last = body["messages"][-1]
    if last["role"] == "user" and last["content"].startswith("write "):
        title = last["content"].removeprefix("write ")
        return ScriptedReply(tool_calls=[tool_call("append_chapter", {"title": title, "text": f"{title}。"},
                                                   f"c{len(body['messages'])}")])
    if last["role"] == "user" and last["content"] == "list":
        return ScriptedReply(tool_calls=[tool_call("list_chapters", {}, f"c{len(body['messages'])}")])
    return ScriptedReply(content="好。")


def _write(client, sid: str, title: str, branch_id: str | None = None) -> str:
    """A turn proposing chapter `title` (on `branch_id`, else the active branch), approved; its id."""
    request = post_turn(client, sid, f"write {title}", branch_id=branch_id)[-1]
    assert request["type"] == "approval_request", request
    final = decide(client, request["approval_id"], True)[-1]
    assert final["type"] == "final", final
    return final["turn_id"]


def _titles(client, sid: str, branch_id: str) -> list[str]:
    files = client.get(f"/api/sessions/{sid}/branches/{branch_id}/files", params={"content": True}).json()
    return [f["content"].splitlines()[0].removeprefix("# ") for f in files]


def _fork(client, sid: str, **body) -> str:
    response = client.post(f"/api/sessions/{sid}/branches", json=body)
    assert response.status_code == 201, response.text
    return response.json()["id"]


def _rows(client, **where) -> int:
    with Session(client.app.state.workbench.engine) as db:
        query = select(WorkspaceFile)
        for name, value in where.items():
            query = query.where(getattr(WorkspaceFile, name) == value)
        return len(db.exec(query).all())


def test_a_forks_files_are_its_own_from_the_fork_point_and_go_with_it(tmp_path):
    with scripted_server(_reply) as fake, \
            workbench_client(make_settings(tmp_path, fake.base_url), ScenarioCatalog()) as client:
        session = new_session(client, "story_writer")
        sid, main = session["id"], session["active_branch_id"]
        hello = post_turn(client, sid, "hello")[-1]["turn_id"]
        three = _write(client, sid, "第三章")
        assert _titles(client, sid, main) == ["第三章"]

        a = _fork(client, sid, turn_id=three, name="a")
        b = _fork(client, sid, turn_id=three, name="b")
        early = _fork(client, sid, turn_id=hello, name="early")  # before chapter 3 was approved
        four_a = _write(client, sid, "第四章 甲", a)

        # approved on fork a: a has it; the parent and the sibling do not
        assert _titles(client, sid, a) == ["第三章", "第四章 甲"]
        assert _titles(client, sid, main) == ["第三章"]
        assert _titles(client, sid, b) == ["第三章"]
        assert _titles(client, sid, early) == []
        # ... and the model sees the same on the sibling: its chapter 4 is its own
        listing = of_type(post_turn(client, sid, "list", branch_id=b), "tool_result")[0]["content"]
        assert "第三章" in listing and "第四章" not in listing
        assert _write(client, sid, "第四章 乙", b) and _titles(client, sid, b) == ["第三章", "第四章 乙"]
        assert _titles(client, sid, a) == ["第三章", "第四章 甲"]

        # a fork of the fork takes what a had at that turn; inside the turn, what was written by then
        deeper = _fork(client, sid, turn_id=four_a, name="deeper")
        assert _titles(client, sid, deeper) == ["第三章", "第四章 甲"]
        checkpoints = client.get(f"/api/sessions/{sid}/branches/{a}/checkpoints").json()
        inside = [c for c in checkpoints if c["turn_id"] == four_a and c["next"]]
        before_tools = next(c for c in inside if c["next"] == ["tools"])
        after_tools = next(c for c in inside if c["next"] == ["model"])
        before = _fork(client, sid, turn_id=four_a, checkpoint_id=before_tools["checkpoint_id"])
        after = _fork(client, sid, turn_id=four_a, checkpoint_id=after_tools["checkpoint_id"])
        assert _titles(client, sid, before) == ["第三章"]
        assert _titles(client, sid, after) == ["第三章", "第四章 甲"]

        # deleting a branch deletes its files, and only its own
        assert _rows(client, branch_id=deeper) == 2
        for branch_id in (deeper, before, after, a):
            assert client.delete(f"/api/sessions/{sid}/branches/{branch_id}").status_code == 204
            assert _rows(client, branch_id=branch_id) == 0
        assert _titles(client, sid, main) == ["第三章"] and _titles(client, sid, b) == ["第三章", "第四章 乙"]
        assert _rows(client, session_id=sid) == 3  # main's chapter 3, b's chapters 3 and 4

        assert client.delete(f"/api/sessions/{sid}").status_code == 204
        assert _rows(client) == 0

