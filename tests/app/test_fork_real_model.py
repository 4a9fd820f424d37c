"""A fork from turn k, run against arbor-server on the embedded model, reuses the KV of turns
1..k: its thread starts from turn k's end checkpoint, so its first request repeats turn k's
request and answer token for token (asserted on the server's own `cached_tokens`)."""

from __future__ import annotations

import pytest

from tests.app.support import make_settings, new_session, post_turn, workbench_client
from tests.server.conftest import start_server, stop_server

pytestmark = [pytest.mark.model, pytest.mark.timeout(600)]


def _model_call(client, sid: str, turn_id: str) -> dict:
    spans = client.get(f"/api/sessions/{sid}/trace", params={"turn_id": turn_id}).json()["spans"]
    [span] = [s for s in spans if s["kind"] == "model"]  # tools forbidden: one step per turn
    return span["attributes"]


def test_a_fork_from_turn_k_reuses_turns_1_to_k(tmp_path):
    server = start_server(tmp_path, "--parallel", "1", "--ctx-size", "4096")
    try:
        settings = make_settings(tmp_path, server.base_url + "/v1", llm_timeout_s=300, llm_max_tokens=24,
                                 llm_temperature=0.0)
        with workbench_client(settings) as client:
            sid = new_session(client)["id"]
            questions = ["Name a colour.", "Name a fruit of that colour.", "Name an animal."]
            turns = [post_turn(client, sid, q, tool_choice="none")[-1] for q in questions]
            assert all(t["type"] == "final" for t in turns), turns
            k = 2
            turn_k = _model_call(client, sid, turns[k - 1]["turn_id"])
            fork = client.post(f"/api/sessions/{sid}/branches", json={"turn_id": turns[k - 1]["turn_id"]})
            assert fork.status_code == 201, fork.text
            forked = post_turn(client, sid, "Name a vegetable instead.", tool_choice="none")[-1]
            assert forked["type"] == "final", forked
            first = _model_call(client, sid, forked["turn_id"])
    finally:
        stop_server(server)
    # turn k's prompt (turns 1..k-1 and k's message) and k's answer come back from the cache
    # (less the end-of-turn token a sampler may stop on without the template writing it)
    through_k = turn_k["gen_ai.usage.input_tokens"] + turn_k["gen_ai.usage.output_tokens"] - 1
    reused = first["gen_ai.usage.cache_read.input_tokens"]
    assert reused >= through_k, (reused, through_k, turn_k, first)
