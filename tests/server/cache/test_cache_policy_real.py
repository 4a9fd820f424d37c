"""--cache-policy on the real server (issue 58, items 2 and 5): the predictive policy learns from the
hints of real requests and /cache/stats says what it holds; a priors file that cannot be read is
refused at start, naming the flag."""

from __future__ import annotations

import subprocess
import sys

import httpx
import pytest

from tests.server.conftest import ROOT, start_server, stop_server

pytestmark = pytest.mark.model

SYSTEM = "You are a terse incident responder. " * 12


def _chat(server, session: str, state: str, turn: int) -> dict:
    body = {"messages": [{"role": "system", "content": SYSTEM},
                         {"role": "user", "content": f"Session {session}: step {turn} of the check."}],
            "max_tokens": 4, "temperature": 0}
    r = httpx.post(server.v1 + "/chat/completions", json=body, timeout=120,
                   headers={"X-Arbor-Session": session, "X-Arbor-Cache-State": state})
    assert r.status_code == 200, r.text
    return r.json()


def test_the_predictive_policy_learns_from_hints_and_reports(tmp_path):
    server = start_server(tmp_path, "--parallel", "2", "--ctx-size", "2048", "--cache-ram", "64",
                          "--cache-policy", "predictive", "--cache-predict-step", "0.5")
    try:
        for turn in range(3):
            _chat(server, "a/main", "tool_wait", turn)
            _chat(server, "b/main", "done" if turn == 2 else "tool_wait", turn)
        httpx.post(server.base_url + "/cache/hint", json={"session": "a/main", "state": "done"}, timeout=30)
        policy = httpx.get(server.base_url + "/cache/stats", timeout=60).json()["policy"]
    finally:
        stop_server(server)
    assert policy["name"] == "predictive" and policy["requests"] == 6
    assert 0 < policy["hit_rate"] < 1, "the shared system prompt was reused"
    predictor = policy["predictor"]
    assert predictor["by_state"]["done"] == 2, "b ended done, a was told done by a bare hint"
    assert predictor["transitions_online"]["tool_wait"]["model_call"] == 4
    assert predictor["params"]["step_s"] == 0.5


def test_a_priors_file_that_cannot_be_read_refuses_to_start(tmp_path):
    bad = tmp_path / "priors.json"
    bad.write_text('{"format": "something else"}')
    done = subprocess.run([sys.executable, "-m", "server", "--cache-priors", str(bad)], cwd=ROOT,
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 2 and "--cache-priors" in done.stderr, done.stderr
    assert "not a lifecycle priors file" in done.stderr
