"""The Replay page: charts of replay result files, or an empty state that says how to make one."""

from __future__ import annotations

import pytest
from playwright.sync_api import expect

from harness.reports.results import RequestResult, RunResult
from harness.reports.summary import summarize

pytestmark = [pytest.mark.browser, pytest.mark.timeout(120)]


def _run(name: str, cached: int, slow: float) -> RunResult:
    requests = [RequestResult(index=i, session_id=f"s{i % 2}", branch_id=None, scheduled_t=i * 0.1, start_s=i * 0.1,
                              ttft_s=slow * (0.05 + 0.01 * i), latency_s=slow * (0.2 + 0.02 * i), prompt_tokens=400,
                              completion_tokens=20, cached_tokens=cached if i else 0, cache_source="S" if i else "none",
                              status=200)
                for i in range(12)]
    requests.append(RequestResult(index=12, session_id="s0", branch_id=None, scheduled_t=1.2, error="timeout"))
    return RunResult(metadata={"base_url": f"http://{name}.local/v1"}, summary=summarize(requests, wall_s=2.0),
                     requests=requests)


def test_replay_page_empty_state(page, workbench):
    page.goto(workbench.url + "/replay")
    expect(page.locator("#replay-empty")).to_contain_text("No replay results yet")
    expect(page.locator("#replay-empty")).to_contain_text(str(workbench.settings.data_dir / "replay"))


def test_replay_page_charts_runs(page, workbench):
    folder = workbench.settings.data_dir / "replay"
    _run("cache-on", cached=300, slow=1.0).save(folder / "cache-on.json")
    _run("cache-off", cached=0, slow=2.0).save(folder / "cache-off.json")
    (folder / "notes.json").write_text('{"not": "a replay"}', encoding="utf-8")

    page.goto(workbench.url + "/replay")
    rows = page.locator("#runs-table tbody tr")
    expect(rows).to_have_count(2)
    on = page.locator("#runs-table tr[data-run='cache-on']")
    expect(on.locator("td").nth(0)).to_have_text("13")  # requests
    expect(on.locator("td").nth(1)).to_have_text("1")   # errors
    expect(on.locator("td").nth(7)).to_have_text(str(300 * 11))  # reused tokens
    expect(page.locator("p.error")).to_contain_text("notes.json is not shown")
    for chart in ("#chart-ttft", "#chart-latency", "#chart-reused"):
        expect(page.locator(f"{chart} svg.chart-svg g.series")).to_have_count(2)
        expect(page.locator(f"{chart} ul.legend li")).to_have_count(2)
    expect(page.locator("#chart-tokens svg.chart-svg rect.bar")).to_have_count(4)
    expect(page.locator("#chart-tokens")).to_contain_text("cache-off")
    assert page.js_errors == []
