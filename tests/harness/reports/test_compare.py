"""compare on stored results: ratios against the first run, PNG and SVG plots, the CLI."""

import pytest

from app.replay.cli import main as replay_main
from harness.reports.compare import compare
from harness.reports.results import RequestResult, RunResult
from harness.reports.summary import summarize
from harness.workloads.ideal import ideal_computed


def stored_run(path, label, ttfts, latencies, cached, wall_s, ideal=None):
    requests = [RequestResult(index=i, session_id="s", branch_id="main", scheduled_t=0.0, start_s=float(i),
                              ttft_s=t, latency_s=lat, prompt_tokens=100, completion_tokens=10, cached_tokens=c)
                for i, (t, lat, c) in enumerate(zip(ttfts, latencies, cached))]
    run = RunResult(metadata={"label": label}, summary=summarize(requests, wall_s, ideal), requests=requests)
    run.save(path)
    return path


def test_ratios_and_plots(tmp_path):
    ideal = ideal_computed([[1] * 100, [1] * 90 + [2] * 10])  # 100 + 10 computed ideally
    a = stored_run(tmp_path / "a.json", "no-cache", [1.0, 3.0], [2.0, 4.0], [0, 0], wall_s=4.0, ideal=ideal)
    b = stored_run(tmp_path / "b.json", "cached", [0.5, 1.0], [1.0, 2.0], [0, 90], wall_s=2.0, ideal=ideal)
    comparison = compare([a, b], tmp_path / "plots")
    assert comparison.labels == ["no-cache", "cached"]
    base, other = comparison.metrics
    assert base["ttft_mean"] == 2.0 and other["ttft_mean"] == 0.75
    assert base["computed_tokens"] == 200 and other["computed_tokens"] == 110
    assert base["computed_over_ideal"] == pytest.approx(200 / 110) and other["computed_over_ideal"] == 1.0
    r = comparison.ratios[1]
    assert r["ttft_mean"] == pytest.approx(0.375)
    assert r["ttft_p50"] == pytest.approx(0.75 / 2.0)
    assert r["latency_mean"] == pytest.approx(1.5 / 3.0)
    assert r["computed_tokens"] == pytest.approx(110 / 200)
    assert r["requests_per_s"] == pytest.approx(2.0) and r["output_tokens_per_s"] == pytest.approx(2.0)
    assert all(v == 1.0 for v in comparison.ratios[0].values())
    names = sorted(p.name for p in comparison.plots)
    assert names == sorted(f"{stem}.{ext}" for stem in ("latency_cdf", "ttft_per_request", "prompt_tokens")
                           for ext in ("png", "svg"))
    for path in comparison.plots:
        data = path.read_bytes()
        assert data.startswith(b"\x89PNG") if path.suffix == ".png" else b"<svg" in data[:2000]
    table = comparison.table()
    assert "cached" in table and "(0.55x)" in table and "(0.38x)" in table


def test_cli_compare_prints_table(tmp_path, capsys):
    a = stored_run(tmp_path / "a.json", None, [1.0], [1.0], [0], wall_s=1.0)
    b = stored_run(tmp_path / "b.json", None, [2.0], [2.0], [50], wall_s=1.0)
    assert replay_main(["compare", str(a), str(b), "--out-dir", str(tmp_path / "out")]) == 0
    out = capsys.readouterr().out
    assert out.splitlines()[0].startswith("run") and "b " in out and "(2.00x)" in out
    assert (tmp_path / "out" / "latency_cdf.svg").is_file()


def test_not_a_results_file(tmp_path, capsys):
    bad = tmp_path / "x.json"
    bad.write_text("{}")
    assert replay_main(["compare", str(bad)]) == 2
    assert "not an arbor replay results file" in capsys.readouterr().err
