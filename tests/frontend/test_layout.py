"""Every page at 1280 px and at 390 px: no horizontal overflow, nothing broken; screenshots.

Set ARBOR_SCREENSHOTS=1 to (re)write docs/screenshots/*.png; otherwise they go to a temp dir.
"""

from __future__ import annotations

import os

import httpx
import pytest
from playwright.sync_api import expect

from tests.fakes.scripted_openai import ScriptedReply, tool_call
from tests.frontend.support import REPO, live_workbench
from tests.frontend.test_replay_page import _run
from tests.workbench_auth import session_cookie

pytestmark = [pytest.mark.browser, pytest.mark.model, pytest.mark.timeout(300)]

WIDTHS = {"wide": (1280, 860), "narrow": (390, 844)}
TABLE_ANSWER = ("Northwind Robotics grew revenue **18.4 %** from 2023Q4 to 2024Q4.\n\n"
                "| Quarter | Revenue (USD m) | Net margin |\n|---|--:|--:|\n| 2023Q4 | 412.0 | 9.1 % |\n"
                "| 2024Q4 | 487.8 | 10.4 % |\n\nThe main driver was the *logistics* segment.")


#: elements sticking out of the viewport that no scrolling box around them contains
WIDE_ELEMENTS = """() => {
  const limit = document.documentElement.clientWidth + 1;
  const clipped = (el) => { for (let p = el.parentElement; p; p = p.parentElement) {
    if (['auto', 'scroll', 'hidden'].includes(getComputedStyle(p).overflowX) && p !== document.body
        && p !== document.documentElement) return true; } return false; };
  return [...document.querySelectorAll('body *')]
    .filter((el) => el.getBoundingClientRect().right > limit && !clipped(el))
    .slice(0, 8)
    .map((el) => `${el.tagName.toLowerCase()}.${el.getAttribute('class') || ''}#${el.id} -> `
                 + `${Math.round(el.getBoundingClientRect().right)}`);
}"""


def _stats_route(server):
    """The fake LLM's /cache/stats answers with a real arbor-server's (the chat stays scripted)."""
    def add(fake):
        async def stats(measure: bool = False) -> dict:
            async with httpx.AsyncClient(timeout=60) as client:
                r = await client.get(server.base_url + "/cache/stats", params={"measure": str(measure).lower()})
            return r.json()
        fake.app.add_api_route("/cache/stats", stats, methods=["GET"])
    return add


def _fill(live) -> str:
    growth = {"company": "NWR", "metric": "revenue", "from_quarter": "2023Q4", "to_quarter": "2024Q4"}
    ratio = {"company": "NWR", "quarter": "2024Q4", "ratio": "net_margin"}
    live.script.on("Compare", ScriptedReply(tool_calls=[tool_call("growth", growth, "g1"),
                                                        tool_call("compute_ratio", ratio, "r1")]),
                   ScriptedReply(content=TABLE_ANSWER, cached_tokens=310, cache_source="S", delay_s=0.05))
    live.script.on("Which companies", ScriptedReply(tool_calls=[tool_call("list_companies", {}, "l1")]),
                   ScriptedReply(content="Three: Northwind Robotics, Cedar Grid Energy and Lumen Bay Health.",
                                 cached_tokens=250, cache_source="A"))
    live.script.on("cash", ScriptedReply(content="Cedar Grid Energy had the strongest operating cash flow.",
                                         cached_tokens=280, cache_source="S"))
    session = live.new_session("financial_research")
    first = live.run_turn(session["id"], "Which companies are covered?")
    live.run_turn(session["id"], "Compare Northwind's revenue growth and net margin over the last year")
    fork = live.api("POST", f"/api/sessions/{session['id']}/branches", json={"turn_id": first["turn"]["id"]})
    assert fork.status_code == 201
    live.run_turn(session["id"], "Which one has the best cash flow?")
    live.api("PATCH", f"/api/sessions/{session['id']}", json={"active_branch_id": session["active_branch_id"]})
    live.script.on("Diagnose", ScriptedReply(tool_calls=[
        tool_call("service_status", {}, "s1"),
        tool_call("propose_action", {"action": "restart_service", "target": "edge-event-api",
                                     "reason": "worker pool exhausted; queue depth keeps growing"}, "p1")]))
    incident = live.new_session("edge_incident")
    live.run_turn(incident["id"], "Diagnose the event service and propose a fix")
    folder = live.settings.data_dir / "replay"
    _run("cache-on", cached=300, slow=1.0).save(folder / "cache-on.json")
    _run("no-cache", cached=0, slow=2.2).save(folder / "no-cache.json")
    return session["id"], incident["id"]


def test_pages_fit_wide_and_narrow_screens(browser, tmp_path, incident_url, script, real_server):
    out = REPO / "docs" / "screenshots" if os.environ.get("ARBOR_SCREENSHOTS") == "1" else tmp_path
    out.mkdir(parents=True, exist_ok=True)
    for question in ("Which turbine runs hottest?", "Which one vibrates most?"):  # the cache page has something to show
        r = httpx.post(real_server.v1 + "/chat/completions", timeout=300, json={
            "messages": [{"role": "system", "content": "You assist wind farm technicians. Be brief. " * 6},
                         {"role": "user", "content": question}], "max_tokens": 2,
            "cache": {"session": "layout/main", "state": "done"}})
        assert r.status_code == 200, r.text
    with live_workbench(tmp_path / "var", incident_url, script, extra_fake_routes=_stats_route(real_server)) as live:
        session_id, incident_id = _fill(live)
        pages = {"home": "/", "session": f"/sessions/{session_id}", "approval": f"/sessions/{incident_id}",
                 "trace": f"/sessions/{session_id}/trace", "cache": "/cache", "replay": "/replay"}
        ready = {"home": "#recent-sessions li a", "session": "#conversation li.turn article.tool-card",
                 "approval": "section.approval", "trace": "svg.timeline", "cache": "section.tier",
                 "replay": "#chart-ttft svg"}
        for width, height in WIDTHS.values():
            context = browser.new_context(viewport={"width": width, "height": height})
            context.add_cookies([session_cookie()])
            page = context.new_page()
            errors: list[str] = []
            page.on("pageerror", lambda exc, errors=errors: errors.append(str(exc)))
            for name, path in pages.items():
                page.goto(live.url + path)
                expect(page.locator(ready[name]).first).to_be_visible()
                if name == "cache":  # two samples, so the page shows changes and lines over time
                    expect(page.locator("#cache-updated")).to_contain_text("2 sample(s)", timeout=15_000)
                    page.get_by_role("button", name="Measure sharing").click()
                    expect(page.locator("#cache-sharing p.score")).to_be_visible()
                else:
                    page.wait_for_load_state("networkidle")
                overflow = page.evaluate("document.documentElement.scrollWidth - document.documentElement.clientWidth")
                assert overflow <= 1, \
                    f"{name} at {width}px scrolls sideways by {overflow}px: {page.evaluate(WIDE_ELEMENTS)}"
                page.screenshot(path=str(out / f"{name}-{width}.png"))
            assert errors == [], errors
            context.close()
