"""Trimming a long tool result (app/agent/trimming.py) by the turn's question: the relevant items
survive a cut, faults survive an unrelated question, kept items stay in order, the output is the
same every time, and the report says what each cut kept. The shape and budget basics:
tests/app/test_agent_units.py."""

from __future__ import annotations

import json

from app.agent.relevance import RelevanceQuery
from app.agent.trimming import trim_tool_result


def _fleet() -> dict:
    """60 pumps' readings: pump-42's are routine, pump-9 has a fault."""
    rows = [{"device": f"pump-{i}", "status": "ok", "note": f"pressure nominal at station {i % 4}"}
            for i in range(60)]
    rows[9] = {"device": "pump-9", "status": "fault", "note": "bearing error, vibration high"}
    return {"site": "north", "rows": rows}


def _kept(shaped) -> list:
    body = json.loads(shaped.context_text.rsplit("\n[trimmed", 1)[0])
    return [r["device"] for r in body["rows"] if isinstance(r, dict)]


def test_a_cut_keeps_the_items_the_question_asks_about():
    shaped = trim_tool_result(_fleet(), 900, "art1", RelevanceQuery("How is pump-42 doing today?"))
    kept = _kept(shaped)
    assert shaped.trimmed and len(shaped.context_text) <= 900
    assert "pump-42" in kept and "pump-9" in kept, "the asked-for pump, and the fault"
    assert kept == sorted(kept, key=lambda d: int(d.split("-")[1])), "kept items stay in their order"


def test_the_call_arguments_rank_too():
    shaped = trim_tool_result(_fleet(), 900, "art1", RelevanceQuery("Any news?", {"device_id": "pump-57"}))
    assert "pump-57" in _kept(shaped)


def test_an_unrelated_question_keeps_the_faults_then_the_first_items():
    shaped = trim_tool_result(_fleet(), 900, "art1", RelevanceQuery("Write me a haiku."))
    kept = _kept(shaped)
    assert "pump-9" in kept and kept[0] == "pump-0"
    assert kept == _kept(trim_tool_result(_fleet(), 900, "art1")), "no question: the same as before ranking"


def test_the_output_is_deterministic():
    query = RelevanceQuery("pump-42 and pump-17 pressure", {"station": 2})
    texts = {trim_tool_result(_fleet(), 900, "art1", query).context_text for _ in range(5)}
    assert len(texts) == 1


def test_the_report_says_what_the_cut_kept_and_why():
    shaped = trim_tool_result(_fleet(), 900, "art9", RelevanceQuery("How is pump-42 doing today?"))
    report = shaped.ranking_report()
    assert report is not None and report["question"] == "How is pump-42 doing today?"
    assert "42" in report["terms"] and "pump" in report["terms"]
    (cut,) = report["lists"]
    assert cut["path"] == "$.rows" and cut["items"] == 60 and cut["kept_count"] == len(_kept(shaped))
    assert 42 in cut["kept"] and 9 in cut["kept"]
    assert cut["relevant"] >= 1 and cut["relevant"] + cut["flagged"] + cut["leading"] == cut["kept_count"]
    assert report["lists_cut"] == 1 and report["dropped_flagged"] == 0
    assert "art9" in shaped.context_text  # the artifact holding the original is named
    assert json.loads(shaped.full_text) == _fleet()


def test_nothing_cut_reports_nothing():
    assert trim_tool_result({"a": [1, 2]}, 100, "x", RelevanceQuery("a")).ranking_report() is None
    assert trim_tool_result("y" * 5000, 300, "x", RelevanceQuery("y")).ranking_report() is None


def test_kept_indices_are_those_of_the_original_list_with_duplicates():
    rows = ["ok"] * 30 + [f"line {i}" for i in range(30)] + ["pump-5 error"]
    shaped = trim_tool_result({"log": rows}, 300, "a", RelevanceQuery("pump-5"))
    (cut,) = shaped.ranking_report()["lists"]
    assert cut["items"] == 32 and 60 in cut["kept"], "index 60 of the original list, not of the distinct items"
