"""The pages fetch what they show: the session page loads the session and its spans without
request bodies (no branch history, no checkpoint state); the trace page fetches a model call's
request only when it is opened."""

from __future__ import annotations

import json

import pytest
from playwright.sync_api import expect

from tests.fakes.scripted_openai import ScriptedReply, tool_call
from tests.frontend.test_session_page import last_turn

pytestmark = [pytest.mark.browser, pytest.mark.timeout(180)]


def test_session_page_loads_spans_without_bodies_and_the_trace_page_fetches_one_on_demand(page, workbench, script):
    script.on("which companies", ScriptedReply(tool_calls=[tool_call("list_companies", {}, "c1")]),
              ScriptedReply(content="Three of them."))
    session = workbench.new_session("financial_research")
    workbench.run_turn(session["id"], "which companies?")
    fetched: list[str] = []
    page.on("request", lambda request: fetched.append(request.url.removeprefix(workbench.url)))

    page.goto(f"{workbench.url}/sessions/{session['id']}")
    expect(last_turn(page).locator(".md.answer")).to_have_text("Three of them.")
    expect(last_turn(page).locator("article.tool-card .tool-name")).to_have_text("list_companies")
    api_calls = [url for url in fetched if url.startswith("/api/")]
    base = f"/api/sessions/{session['id']}"
    assert f"{base}/trace?bodies=false" in api_calls
    assert not [url for url in api_calls if url.startswith(f"{base}/trace") and "bodies=false" not in url]
    assert not [url for url in api_calls if url.startswith(f"{base}/branches/") and "/open" not in url]

    fetched.clear()
    page.goto(f"{workbench.url}/sessions/{session['id']}/trace")
    rows = page.locator("table.spans tbody tr[data-kind='model']")
    expect(rows).to_have_count(2)
    assert not [url for url in fetched if url.startswith("/api/spans/")]  # nothing until asked
    rows.nth(1).locator("details.request-body summary").click()
    body = rows.nth(1).locator("details.request-body pre")
    expect(body).to_contain_text('"role": "tool"')
    shown = json.loads(body.inner_text())
    assert shown == workbench.fake.bodies[1]  # the exact request of that model call
    assert len([url for url in fetched if url.startswith("/api/spans/")]) == 1
    assert page.js_errors == []
