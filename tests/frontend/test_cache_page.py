"""The Cache page: a real arbor-server's /cache/stats live, its sharing score when asked, and
an honest empty state when the server has no stats."""

from __future__ import annotations

import re
import uuid

import httpx
import pytest
from playwright.sync_api import expect

from app.main import create_app
from app.settings import WorkbenchSettings
from tests.frontend.support import serve

pytestmark = [pytest.mark.browser, pytest.mark.timeout(300)]

SYSTEM = ("You are the maintenance assistant of a wind farm. Answer briefly, name the turbine, and "
          "say which reading you used. ") * 3


def _ask(server, question: str) -> dict:
    r = httpx.post(server.v1 + "/chat/completions", timeout=300, json={
        "messages": [{"role": "system", "content": SYSTEM}, {"role": "user", "content": question}],
        "max_tokens": 2, "temperature": 0})
    assert r.status_code == 200, r.text
    return r.json()


def _stats(server, measure: bool = False) -> dict:
    r = httpx.get(server.base_url + "/cache/stats", params={"measure": "true"} if measure else None, timeout=120)
    assert r.status_code == 200, r.text
    return r.json()


def _num(page, section: str, field: str):
    return page.locator(f"section.tier[data-tier='{section}'] tr[data-field='{field}'] td.num")


def _int(text: str) -> int:
    return int(text.replace(",", ""))


def test_cache_page_says_when_the_server_has_no_stats(page, workbench):
    page.goto(workbench.url + "/cache")
    empty = page.locator("#cache-empty")
    expect(empty).to_be_visible()
    expect(empty).to_contain_text("Cache stats not available from this server")
    expect(empty).to_contain_text("HTTP 404")
    expect(page.locator("#cache-tiers section")).to_have_count(0)
    expect(page.get_by_role("button", name="Measure sharing")).to_be_disabled()


@pytest.mark.model
def test_cache_page_shows_a_real_servers_stats_live_and_measures_sharing(page, real_server, tmp_path):
    _ask(real_server, "Which turbine runs hottest?")
    reused = _ask(real_server, "Which turbine vibrates most?")  # shares the system prompt
    assert reused["usage"]["prompt_tokens_details"]["cached_tokens"] > 0
    source = reused["arbor"]["cache"]["source"]
    settings = WorkbenchSettings(_env_file=None, llm_base_url=real_server.v1, llm_model="", data_dir=tmp_path / "var")
    with serve(create_app(settings), "workbench") as url:
        page.goto(url + "/cache")
        truth = _stats(real_server)
        titles = page.locator("section.tier h2")
        expect(titles).to_have_text(["Requests by prefix source", "A · active slot", "S · resident", "H · host RAM",
                                     "D · disk", "Plans the router chose", "Sessions by lifecycle hint", "KV cells",
                                     "Engine thread", "Measured rates"])
        expect(page.locator("#cache-overview")).to_contain_text(f"Route: {truth['route']}")
        # the numbers are the server's own fields
        expect(_num(page, "requests", f"requests.{source}")).to_have_text(
            f"{truth['requests_by_source'][source]:,}")
        expect(_num(page, "requests", f"reused_tokens.{source}")).to_have_text(
            f"{truth['reused_tokens_by_source'][source]:,}")
        budget_gib = truth["tiers"]["H"]["budget_bytes"] / 2**30
        expect(_num(page, "H", "budget_bytes")).to_have_text(f"{budget_gib:.1f} GiB")
        expect(_num(page, "S", "budget_cells")).to_have_text(f"{truth['tiers']['S']['budget_cells']:,}")
        expect(_num(page, "kv", "n_ctx")).to_have_text(f"{truth['kv']['n_ctx']:,}")
        # default tiers A,S,H
        expect(page.locator("section.tier[data-tier='D']")).to_contain_text("Off on this server.")

        # live: a request and a lifecycle hint while the page is open show up in later samples
        before = truth["requests_by_source"]
        answer = _ask(real_server, "Which turbine needs service first?")
        after_source = answer["arbor"]["cache"]["source"]
        expect(_num(page, "requests", f"requests.{after_source}")).to_have_text(
            f"{before[after_source] + 1:,}", timeout=20_000)
        pinned = _stats(real_server)["lifecycle"]["pinned"]
        hint = httpx.post(real_server.base_url + "/cache/hint", timeout=30,
                          json={"session": f"page-{uuid.uuid4().hex[:6]}/main", "pin": True})
        assert hint.status_code == 200
        expect(_num(page, "lifecycle", "pinned")).to_have_text(f"{pinned + 1:,}", timeout=20_000)
        expect(page.locator("#cache-updated")).to_contain_text("sample(s)")
        rows = page.locator(f"section.tier[data-tier='requests'] tr[data-field='requests.{after_source}']")
        expect(rows.locator("svg.sparkline path")).to_have_count(1)

        # the sharing score needs ?measure=true: only on request, and equal to the server's own numbers
        page.get_by_role("button", name="Measure sharing").click()
        score = page.locator("#cache-sharing p.score")
        expect(score).to_contain_text("KV cells in use against the union bound")
        measured = _stats(real_server, measure=True)["kv"]  # nothing runs now: the same state
        assert measured["union_bound"] > 0
        found = re.search(r"([\d,]+) / ([\d,]+) = (\d+\.\d\d)", score.inner_text())
        assert found, score.inner_text()
        assert (_int(found[1]), _int(found[2])) == (measured["used_cells"], measured["union_bound"])
        assert found[3] == f"{measured['used_cells'] / measured['union_bound']:.2f}"
        page.get_by_role("button", name="Pause updates").click()
        expect(page.get_by_role("button", name="Resume updates")).to_have_attribute("aria-pressed", "true")
        assert page.js_errors == []
