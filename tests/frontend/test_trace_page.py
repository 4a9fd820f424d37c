"""The Trace page: per-turn span timelines with TTFT, tokens computed vs reused, cache source, totals."""

from __future__ import annotations

import pytest
from playwright.sync_api import expect

from tests.fakes.scripted_openai import ScriptedReply, tool_call

pytestmark = [pytest.mark.browser, pytest.mark.timeout(180)]


def test_trace_shows_model_and_tool_spans_with_cache_numbers(page, workbench, script):
    script.on("growth", ScriptedReply(tool_calls=[tool_call("list_companies", {}, "c1")], cached_tokens=0),
              ScriptedReply(content="Growth was steady.", cached_tokens=37, cache_source="S", delay_s=0.05))
    script.on("broken", ScriptedReply(tool_calls=[tool_call("get_report", {"company": "NOPE", "quarter": "2024Q1",
                                                                            "statement": "income"}, "c2")]),
              ScriptedReply(content="That company does not exist."))
    session = workbench.new_session("financial_research")
    workbench.run_turn(session["id"], "How was growth?")
    branch = workbench.api("POST", f"/api/sessions/{session['id']}/branches", json={"turn_id": None, "name": "side"})
    assert branch.status_code == 201
    workbench.run_turn(session["id"], "A broken lookup")

    page.goto(f"{workbench.url}/sessions/{session['id']}/trace")
    sections = page.locator("section.turn-trace")
    expect(sections).to_have_count(2)
    first = sections.first
    expect(first.locator("h2")).to_contain_text("How was growth?")
    svg = first.locator("svg.timeline")
    expect(svg.locator("g.span-model")).to_have_count(2)
    expect(svg.locator("g.span-tool")).to_have_count(1)
    expect(svg.locator("g.span-model rect.ttft")).to_have_count(2)
    expect(svg.locator("g.span-model").first).to_contain_text("TTFT")
    rows = first.locator("table.spans tbody tr[data-kind='model']")
    expect(rows).to_have_count(2)
    expect(rows.nth(1).locator("td.reused")).to_have_text("37")
    expect(rows.nth(1).locator("td.cache-source")).to_have_text("S")
    expect(rows.nth(0).locator("td.cache-source")).to_have_text("not reported")

    second = sections.nth(1)
    expect(second.locator("svg g.span-error")).to_have_count(1)
    expect(second.locator("table.spans tr[data-kind='tool']")).to_contain_text("✗ error")

    totals = page.locator("#totals")
    expect(totals.locator("tbody tr")).to_have_count(3)  # session, main, side
    expect(totals).to_contain_text("Branch main")
    expect(totals).to_contain_text("Branch side")
    api_summary = workbench.api("GET", f"/api/sessions/{session['id']}/trace").json()["summary"]
    session_row = totals.locator("tbody tr").first
    expect(session_row.locator("td").nth(3)).to_have_text(f"{api_summary['cached_input_tokens']:,}")

    # the branch filter narrows the turns to one branch's path
    page.get_by_label("Show turns of").select_option(label="branch side (its path)")
    expect(sections).to_have_count(1)
    expect(sections.first.locator("h2")).to_contain_text("A broken lookup")
    assert page.js_errors == []
