"""The Cache page: live /cache/stats per tier, and an honest empty state when there are none."""

from __future__ import annotations

import itertools

import pytest
from playwright.sync_api import expect

from tests.frontend.support import live_workbench

pytestmark = [pytest.mark.browser, pytest.mark.timeout(120)]


def test_cache_page_says_when_the_server_has_no_stats(page, workbench):
    page.goto(workbench.url + "/cache")
    empty = page.locator("#cache-empty")
    expect(empty).to_be_visible()
    expect(empty).to_contain_text("Cache stats not available from this server")
    expect(empty).to_contain_text("HTTP 404")
    expect(page.locator("#cache-tiers section")).to_have_count(0)


def test_cache_page_shows_tiers_over_time(page, tmp_path, incident_url, script):
    counter = itertools.count(1)

    def add_stats_route(fake):
        def stats() -> dict:
            n = next(counter)
            return {"tiers": {"S": {"entries": n, "bytes": 2048 * n, "hits": 3 * n, "evictions": 0,
                                    "resident_cells": 120, "union_bound_cells": 100},
                              "H": {"entries": 2, "bytes": 1_048_576, "hits": n, "evictions": n // 2}},
                    "requests": 10 * n}
        fake.app.add_api_route("/cache/stats", stats, methods=["GET"])

    with live_workbench(tmp_path / "var", incident_url, script, extra_fake_routes=add_stats_route) as live:
        page.goto(live.url + "/cache")
        tiers = page.locator("#cache-tiers section.tier")
        expect(tiers).to_have_count(3)  # H, S, overall
        s_tier = page.locator("section.tier[data-tier='S']")
        expect(s_tier.locator("h2")).to_have_text("S · resident")
        expect(s_tier).to_contain_text("Resident cells against the union bound: 120 / 100 = 1.20")
        expect(page.locator("section.tier[data-tier='H'] tr[data-field='bytes'] td.num")).to_have_text("1.0 MiB")
        # refreshed live: a second sample arrives, with its change and a line over time
        expect(page.locator("#cache-updated")).to_contain_text("2 sample(s)", timeout=15_000)
        expect(s_tier.locator("tr[data-field='hits'] td.delta")).to_contain_text("▲ +3")
        expect(s_tier.locator("tr[data-field='hits'] svg.sparkline path")).to_have_count(1)
        expect(page.locator("#cache-empty")).to_be_hidden()
        page.get_by_role("button", name="Pause updates").click()
        expect(page.get_by_role("button", name="Resume updates")).to_have_attribute("aria-pressed", "true")
        assert page.js_errors == []
