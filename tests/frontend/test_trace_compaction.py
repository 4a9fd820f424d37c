"""The Trace page shows a compacted history: a "compacted" span before the model call, with
the estimated tokens before and after (issue 16)."""

from __future__ import annotations

import pytest
from playwright.sync_api import expect

from tests.fakes.scripted_openai import ScriptedReply

pytestmark = [pytest.mark.browser, pytest.mark.timeout(180)]


def test_trace_shows_each_compaction_with_tokens_before_and_after(page, workbench, script):
    script.on("report", ScriptedReply(content="A long report line. " * 150))  # ~3,000 characters
    workbench.fake.n_ctx = 2500  # tokens one request may hold, reported by the fake's /props
    session = workbench.new_session("financial_research")
    for n in range(5):
        workbench.run_turn(session["id"], f"report number {n}")

    spans = workbench.api("GET", f"/api/sessions/{session['id']}/trace").json()["spans"]
    compactions = [s for s in spans if s["kind"] == "compaction"]
    assert compactions, "the session never compacted"
    page.goto(f"{workbench.url}/sessions/{session['id']}/trace")
    expect(page.locator("svg.timeline g.span-compaction")).to_have_count(len(compactions))
    rows = page.locator("table.spans tbody tr[data-kind='compaction']")
    expect(rows).to_have_count(len(compactions))
    last = compactions[-1]["attributes"]
    expect(rows.last).to_contain_text(
        f"{last['arbor.compaction.tokens_before']:,} → {last['arbor.compaction.tokens_after']:,} tokens")
    expect(rows.last).to_contain_text("context 2,500 tokens")
    expect(rows.last.locator("th")).to_have_text("compacted before step 1")
    assert page.js_errors == []
