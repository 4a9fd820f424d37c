"""The workbench's cache hints reach a real arbor-server (embedded model) and change what its
session registry holds: pinned while the branch is open, done after a turn, released on delete."""

from __future__ import annotations

import httpx
import pytest

from tests.app.support import make_settings, new_session, post_turn, workbench_client
from tests.server.conftest import start_server, stop_server

pytestmark = [pytest.mark.model, pytest.mark.timeout(600)]


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    running = start_server(tmp_path_factory.mktemp("hints"), "--parallel", "1", "--ctx-size", "4096")
    yield running
    stop_server(running)


def _held(server, key: str) -> dict:
    """What the server holds for `key`: a bare hint without state or pin changes nothing."""
    r = httpx.post(server.base_url + "/cache/hint", json={"session": key}, timeout=30)
    assert r.status_code == 200, r.text
    return {k: r.json()[k] for k in ("state", "pinned", "known")}


def test_open_branch_turn_and_delete_as_the_server_sees_them(server, tmp_path):
    # one model step, tools forbidden: the turn is one request and an answer
    settings = make_settings(tmp_path, server.v1, step_budget=1, llm_max_tokens=8, llm_temperature=0.0,
                             llm_timeout_s=300.0)
    with workbench_client(settings) as client:
        session = new_session(client)
        sid, main_id = session["id"], session["active_branch_id"]
        key = f"{sid}/{main_id}"
        assert _held(server, key)["known"] is False

        assert client.post(f"/api/sessions/{sid}/branches/{main_id}/open").status_code == 204
        assert _held(server, key) == {"state": "active", "pinned": True, "known": True}

        events = post_turn(client, sid, "Say hello.")
        assert events[-1]["type"] == "final", events[-1]
        assert _held(server, key) == {"state": "done", "pinned": True, "known": True}
        lifecycle = httpx.get(server.base_url + "/cache/stats", timeout=60).json()["lifecycle"]
        assert lifecycle["pinned"] == 1 and lifecycle["by_state"]["done"] == 1

        assert client.delete(f"/api/sessions/{sid}").status_code == 204
        assert _held(server, key) == {"state": "done", "pinned": False, "known": True}
        assert httpx.get(server.base_url + "/cache/stats", timeout=60).json()["lifecycle"]["pinned"] == 0
