"""The Session page in Chromium, served by one workbench process while another runs the turn
(two `arbor serve` processes on one PostgreSQL): the page follows the turn live from the
database's journal, to its end, and its Stop button stops a turn the other process runs."""

from __future__ import annotations

import time
from contextlib import ExitStack

import httpx
import pytest
from playwright.sync_api import expect

from tests.app.processes import workbench
from tests.app.support import SseReader
from tests.fakes.scripted_openai import ScriptedReply, scripted_server
from tests.frontend.test_session_page import last_turn
from tests.pg_cluster import TempCluster, unavailable_reason
from tests.workbench_auth import AUTH_HEADERS

pytestmark = [pytest.mark.browser, pytest.mark.timeout(240)]


def _words(n: int) -> str:
    return " ".join(f"word{i}" for i in range(n))


def _reply(body: dict) -> ScriptedReply:
    user = [m for m in body["messages"] if m["role"] == "user"][-1]["content"]
    if user == "stop me":
        return ScriptedReply(content=_words(400), token_delay_s=0.05)  # 20 s unless stopped
    return ScriptedReply(content=_words(100), token_delay_s=0.05)  # about 5 s


@pytest.fixture(scope="module")
def two_workbenches(tmp_path_factory):
    """(A, B, the scripted model): two workbench processes on one fresh PostgreSQL database."""
    reason = unavailable_reason()
    if reason:
        pytest.skip(reason)
    tmp = tmp_path_factory.mktemp("two-workbenches")
    cluster = TempCluster().start()
    try:
        database = cluster.url(cluster.create_database())
        with scripted_server(_reply) as fake, ExitStack() as stack:
            a, _ = stack.enter_context(workbench(tmp, "a", database, fake.base_url))
            b, _ = stack.enter_context(workbench(tmp, "b", database, fake.base_url))
            yield a, b, fake
    finally:
        cluster.stop()


def _start_on(url: str, session: str, message: str) -> SseReader:
    """A turn started through process `url` (another user's tab); returns its reader once it streams."""
    reader = SseReader("POST", f"{url}/api/sessions/{session}/turns", json={"message": message})
    reader.start()
    reader.wait_for(lambda events: sum(e["type"] == "token" for e in events) >= 3, "tokens")
    return reader


def test_the_page_of_another_process_follows_the_turn_live_to_its_end(page, two_workbenches):
    a, b, _ = two_workbenches
    session = httpx.post(f"{a}/api/sessions", json={"scenario": "edge_incident"}, timeout=30,
                         headers=AUTH_HEADERS).json()["id"]
    other_tab = _start_on(a, session, "read the gauges")

    page.goto(f"{b}/sessions/{session}")  # process B serves the page; A runs the turn
    turn = last_turn(page)
    expect(turn.locator(".md.streaming")).to_contain_text("word0 word1 word2")
    turn_id = other_tab.events[0]["turn_id"]
    assert httpx.get(f"{b}/api/turns/{turn_id}", timeout=10, headers=AUTH_HEADERS).json()["status"] == "running"
    expect(turn).to_have_attribute("data-status", "completed", timeout=30_000)
    expect(turn.locator(".md.answer")).to_have_text(_words(100))
    other_tab.join(30)
    assert other_tab.events[-1]["type"] == "final"
    assert page.js_errors == []


def test_stop_on_the_page_of_another_process_stops_the_turn(page, two_workbenches):
    a, b, fake = two_workbenches
    session = httpx.post(f"{a}/api/sessions", json={"scenario": "edge_incident"}, timeout=30,
                         headers=AUTH_HEADERS).json()["id"]
    aborted = fake.aborted
    other_tab = _start_on(a, session, "stop me")

    page.goto(f"{b}/sessions/{session}")
    turn = last_turn(page)
    expect(turn.locator(".md.streaming")).to_contain_text("word0 word1 word2")
    page.get_by_role("button", name="Stop").click()
    expect(turn).to_have_attribute("data-status", "cancelled", timeout=30_000)
    expect(turn.locator(".turn-error")).to_contain_text("You stopped this turn")
    other_tab.join(30)
    assert other_tab.events[-1]["type"] == "cancelled"  # A stopped it
    deadline = time.monotonic() + 10
    while fake.aborted <= aborted:  # and closed its model request
        assert time.monotonic() < deadline, "the model request was not closed"
        time.sleep(0.05)
    assert "word399" not in turn.inner_text()
    assert page.js_errors == []
