"""Speculative decoding through the real server (embedded model): on by default (auto), llama-server's per-request
fields and `timings`, /props and /metrics; the answers with drafting are the answers without (the request's own
speculative.n_max 0), streamed or not, after a cache hit, with n > 1; bad input is a 400 naming the field, and a
drafter the server cannot run refuses to start naming the flag."""

from __future__ import annotations

import json
import subprocess
import sys
import time

import httpx
import pytest

from harness.models.family_model import write_family_model
from tests.server.conftest import ROOT, start_server, stop_server

pytestmark = pytest.mark.model

CODE = "\n".join(f"def func_{i}(x):\n    return x * {i} + {i * i}\n" for i in range(8))
REWRITE = [{"role": "user", "content": "Rewrite this Python file, renaming func_3 to triple. Output the whole file."
                                       "\n\n" + CODE}]


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    running = start_server(tmp_path_factory.mktemp("spec"), "--parallel", "2", "--ctx-size", "4096")
    yield running
    stop_server(running)


def chat(server, n_max: int | None = None, **extra) -> dict:
    body = {"messages": REWRITE, "max_tokens": 80, "temperature": 0, **extra}
    if n_max is not None:
        body["speculative.n_max"] = n_max
    r = httpx.post(server.v1 + "/chat/completions", json=body, timeout=300)
    assert r.status_code == 200, r.text
    return r.json()


def streamed(server, **extra) -> tuple[str, dict]:
    body = {"messages": REWRITE, "max_tokens": 80, "temperature": 0, "stream": True, **extra}
    text, last = [], {}
    with httpx.stream("POST", server.v1 + "/chat/completions", json=body, timeout=300) as r:
        for line in r.iter_lines():
            if line.startswith("data: ") and line != "data: [DONE]":
                chunk = json.loads(line[6:])
                for choice in chunk.get("choices", []):
                    text.append(choice["delta"].get("content") or "")
                if "timings" in chunk:
                    last = chunk
    return "".join(text), last


def test_drafting_is_on_by_default_and_props_say_with_what(server):
    spec = httpx.get(server.base_url + "/props").json()["arbor"]["speculative"]
    assert spec["enabled"] and spec["types"] == ["ngram-map-k"] and spec["policy"] == "adaptive"


def test_the_drafted_answer_is_the_undrafted_one_and_timings_say_what_was_drafted(server):
    without = chat(server, n_max=0)
    drafted = chat(server)
    assert drafted["choices"][0]["message"]["content"] == without["choices"][0]["message"]["content"]
    assert without["timings"]["draft_n"] == 0 and without["timings"]["draft_n_accepted"] == 0
    t = drafted["timings"]
    assert t["draft_n"] > 0 and 0 < t["draft_n_accepted"] <= t["draft_n"]
    assert drafted["usage"]["prompt_tokens_details"]["cached_tokens"] > 0  # after a cache hit (the same prompt)


def test_a_streamed_drafted_answer_is_the_same_text(server):
    whole = chat(server, n_max=0)["choices"][0]["message"]["content"]
    text, last = streamed(server)
    assert text == whole and last["timings"]["draft_n_accepted"] > 0


def test_each_of_n_choices_drafts_its_own(server):
    one = chat(server, n_max=0)["choices"][0]["message"]["content"]
    both = chat(server, n=2)
    assert [c["message"]["content"] for c in both["choices"]] == [one, one]
    assert both["timings"]["draft_n_accepted"] > 0


def test_metrics_count_drafted_and_accepted_tokens(server):
    chat(server)
    text = httpx.get(server.base_url + "/metrics").text
    drafted = float(next(line.split()[-1] for line in text.splitlines() if line.startswith("arbor:draft_tokens_total")))
    accepted = float(next(line.split()[-1] for line in text.splitlines()
                          if line.startswith("arbor:draft_tokens_accepted_total")))
    assert drafted >= accepted > 0


@pytest.mark.parametrize("fields, param", [
    ({"speculative.n_max": -1}, "speculative.n_max"),
    ({"speculative.n_max": 5000}, "speculative.n_max"),
    ({"speculative": {"n_min": -2}}, "speculative"),
    ({"speculative.n_max": 2, "speculative.n_min": 4}, None),
    ({"speculative.p_min": 0.5}, "speculative.p_min"),
])
def test_bad_speculative_fields_are_a_400_naming_them(server, fields, param):
    r = httpx.post(server.v1 + "/chat/completions", json={"messages": REWRITE, "max_tokens": 4, **fields}, timeout=60)
    assert r.status_code == 400, r.text
    error = r.json()["error"]
    assert "speculative" in (error.get("param") or "") + error["message"]
    if param is not None:
        assert (error.get("param") or "").startswith(param)
    assert httpx.get(server.base_url + "/health").json()["status"] == "ok"


def test_an_unknown_or_unsupported_spec_type_refuses_to_start():
    for flag, said in ((["--spec-type", "ngram-foo"], "unknown --spec-type ngram-foo"),
                       (["--spec-type", "draft-mtp"], "draft-mtp: drafts from the target's hidden states"),
                       (["--spec-type", "draft-simple"], "needs a draft model: --spec-draft-model")):
        done = subprocess.run([sys.executable, "-m", "server", *flag], cwd=ROOT, capture_output=True, text=True,
                              timeout=60)
        assert done.returncode == 2 and "--spec-type" in done.stderr and said in done.stderr, done.stderr


def test_a_draft_model_with_another_vocabulary_is_refused(tmp_path):
    """The process stays up and says why in /health (as every model that fails to load), naming the flag."""
    other = write_family_model("llama3.1", tmp_path / "llama3.gguf")
    running = start_server(tmp_path, "--spec-type", "draft-simple", "--spec-draft-model", str(other), wait=False)
    try:
        deadline = time.monotonic() + 120
        health = None
        while time.monotonic() < deadline and running.proc.poll() is None:
            try:
                health = httpx.get(running.base_url + "/health", timeout=2)
            except httpx.TransportError:
                time.sleep(0.2)
                continue
            if health.status_code != 503:  # 503: still loading
                break
            time.sleep(0.2)
        assert health is not None and health.status_code == 500, running.log()[-2000:]
        message = health.json()["error"]["message"]
        assert "--spec-type draft-simple" in message and "vocab" in message
    finally:
        stop_server(running)


@pytest.mark.parametrize("tiers", ["A,H", "A,D"])
def test_a_drafted_answer_after_a_restore_from_a_stored_tier_is_the_same(tmp_path, tiers):
    """One slot: the rewrite without drafting, another prompt (the slot's KV goes to the host or disk tier), then
    the rewrite again with drafting, its prompt restored from that tier."""
    flags = ["--parallel", "1", "--ctx-size", "2048", "--cache-tiers", tiers]
    if "D" in tiers:
        flags += ["--cache-dir", str(tmp_path / "kv")]
    running = start_server(tmp_path, *flags)
    try:
        plain = chat(running, n_max=0)
        other = httpx.post(running.v1 + "/chat/completions", timeout=300,
                           json={"messages": [{"role": "user", "content": "Name three colours."}], "max_tokens": 8})
        assert other.status_code == 200
        drafted = chat(running)
        assert drafted["arbor"]["cache"]["source"] == tiers[-1]
        assert drafted["choices"][0]["message"]["content"] == plain["choices"][0]["message"]["content"]
        assert drafted["timings"]["draft_n_accepted"] > 0
    finally:
        stop_server(running)
