"""story_writer against arbor-server on the embedded model: a turn over the manuscript whose
later model call reuses the long prefix (system prompt = outline + reference library + chapters).
The library is generated at its smallest size (its fixed part, ~2K tokens): the default size
fills most of the 8K context, which 2 CPU cores take ~45 s to prefill
(tests/scenarios/test_story_corpus.py measures it without prefilling).

The first step is forced (tool_choice "required"); a chapter the model proposes is rejected,
so the shipped data and the workspace stay as they are. Assertions are on structure and on
the server's own `cached_tokens`, not on wording.
"""

from __future__ import annotations

import pytest

from tests.app.real_backends import real_backends
from tests.app.support import forced_turn_rejecting_proposals, workbench_client

pytestmark = pytest.mark.model


def test_story_turn_reuses_the_manuscript_prefix(tmp_path):
    from app.scenario_catalog import ScenarioCatalog
    from app.settings import WorkbenchSettings
    from scenarios.story_writer.scenario import build_scenario

    (tmp_path / "logs").mkdir()
    with real_backends(tmp_path / "logs", [], incident=False) as urls:
        settings = WorkbenchSettings(_env_file=None, llm_base_url=urls["llm"], data_dir=tmp_path / "var",
                                     llm_timeout_s=300, llm_max_tokens=48, llm_temperature=0.0, step_budget=3)
        with workbench_client(settings, catalog=ScenarioCatalog([build_scenario(0)])) as client:
            session = client.post("/api/sessions", json={"scenario": "story_writer"}).json()
            events = forced_turn_rejecting_proposals(client, session["id"], "林澈的左手有什么问题？")
            assert [e for e in events if e["type"] == "tool_result"], [e["type"] for e in events]
            assert events[-1]["type"] == "final", events[-1]

            spans = client.get(f"/api/sessions/{session['id']}/trace").json()["spans"]
            model_spans = [s["attributes"] for s in spans if s["kind"] == "model"]
    assert len(model_spans) >= 2
    later = model_spans[1]
    prompt, reused = later["gen_ai.usage.input_tokens"], later["gen_ai.usage.cache_read.input_tokens"]
    # the system prompt is ~3.5K tokens of the prompt: most of it must come from the cache
    assert prompt > 1500 and reused >= prompt // 2, (prompt, reused)
    assert not (tmp_path / "var" / "workspace" / "story_writer").exists()
