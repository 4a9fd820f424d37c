"""bench.story_run against a workbench and the scripted fake (no model): every request streamed
to its end, a chapter's proposal approved and the turn continued, the per-request figures added
up from the events, the manifest of the model requests written, and its docs section."""

from __future__ import annotations

import json

from app.main import create_app
from app.scenario_catalog import ScenarioCatalog
from bench import story_run
from harness.manifest import read_manifest
from tests.app.support import live_server, make_settings
from tests.fakes.scripted_openai import ScriptedReply, scripted_server, tool_call
from tests.workbench_auth import WORKBENCH_TOKEN


def _agent(body: dict) -> ScriptedReply:
    last = body["messages"][-1]
    if last["role"] == "user" and body.get("tool_choice") == story_run.APPEND:
        return ScriptedReply(tool_calls=[tool_call("append_chapter", {"title": "第三章", "text": "雾夜。"})],
                             cached_tokens=100, cache_source="A")
    if last["role"] == "user":
        return ScriptedReply(tool_calls=[tool_call("list_chapters", {})], cached_tokens=50, cache_source="A")
    return ScriptedReply(content="好的。", cached_tokens=200, cache_source="A")


def test_the_run_streams_every_request_approves_chapters_and_writes_its_manifest(tmp_path):
    prompts = story_run.story_prompts(5)
    assert [("tool_choice" in p, p.get("force_tool", False)) for p in prompts] == \
        [(True, False), (False, True), (False, True), (False, True), (True, False)]
    with scripted_server(_agent) as fake, \
            live_server(create_app(make_settings(tmp_path, fake.base_url, max_message_chars=2000),
                                   ScenarioCatalog())) as url:
        wb = story_run.Workbench(url, WORKBENCH_TOKEN, 60)
        result = story_run.run(wb, prompts, tmp_path / "m.jsonl", log=lambda line: None)
    rows, summary = result["rows"], result["summary"]
    assert [r["outcome"] for r in rows] == ["answered"] * 5 and summary["failed"] == 0
    assert [r["approvals"] for r in rows] == [1, 0, 0, 0, 1] and summary["approvals"] == 2
    assert rows[0]["tools"] == ["append_chapter"] and rows[1]["tools"] == ["list_chapters"]
    assert all(r["steps"] == 2 and r["ttft_s"] is not None and r["turn_s"] >= r["ttft_s"] for r in rows)
    assert rows[1]["cached_tokens"] == 250 and rows[1]["cache_sources"] == ["A", "A"]
    assert 0 < summary["reuse"] < 1
    manifest = read_manifest(tmp_path / "m.jsonl")
    assert len(manifest) == len(fake.bodies) == 10
    assert manifest[0].body["messages"] == fake.bodies[0]["messages"]

    (tmp_path / "story_run.json").write_text(json.dumps({"summary": summary, "rows": rows}))
    section = story_run.report_section(tmp_path)
    assert section[0] == story_run.HEADING and "5 of 5 requests ended with an answer" in "\n".join(section)
    assert sum(1 for line in section if line.startswith("| ")) == 1 + 5  # the header and a row each
