"""llama-server's native POST /completion on the real server (raw HTTP: no OpenAI client speaks it)."""

from __future__ import annotations

import json

import httpx
import openai
import pytest

pytestmark = pytest.mark.model

PROMPT = "The capital of France is"


@pytest.fixture(scope="module")
def post(arbor_server):
    def call(**body) -> httpx.Response:
        return httpx.post(arbor_server.base_url + "/completion", json=body, timeout=120)
    return call


def events(arbor_server, **body) -> list[dict]:
    with httpx.stream("POST", arbor_server.base_url + "/completion", json={**body, "stream": True},
                      timeout=120) as r:
        assert r.status_code == 200
        lines = [line for line in r.iter_lines() if line]
    assert all(line.startswith("data: ") for line in lines)
    assert lines[-1] != "data: [DONE]"  # llama-server's native stream has no terminator
    return [json.loads(line[6:]) for line in lines]


def test_matches_v1_completions_and_reports_llama_server_fields(post, arbor_server):
    r = post(prompt=PROMPT, n_predict=6, temperature=0, cache_prompt=True, return_tokens=True).json()
    v1 = openai.OpenAI(base_url=arbor_server.v1, api_key="unused", max_retries=0).completions.create(
        model="", prompt=PROMPT, max_tokens=6, temperature=0)
    assert r["content"] == v1.choices[0].text
    assert r["stop"] is True and r["stop_type"] == "limit" and r["stopping_word"] == ""
    assert r["tokens_predicted"] == v1.usage.completion_tokens == 6 == len(r["tokens"])
    assert r["tokens_evaluated"] == v1.usage.prompt_tokens
    assert set(r["timings"]) >= {"prompt_n", "prompt_ms", "predicted_n", "predicted_ms", "cache_n"}
    assert r["model"] == v1.model and r["prompt"] == PROMPT


def test_stream_events_add_up_to_the_answer(post, arbor_server):
    full = post(prompt=PROMPT, n_predict=6, temperature=0).json()
    evs = events(arbor_server, prompt=PROMPT, n_predict=6, temperature=0)
    assert all(e["stop"] is False for e in evs[:-1]) and evs[-1]["stop"] is True
    assert "".join(e["content"] for e in evs) == full["content"]
    assert evs[-1]["tokens_predicted"] == 6 and evs[-1]["stop_type"] == "limit"


def test_stop_types_eos_and_word_with_grammar(post):
    r = post(prompt="Answer:", n_predict=10, grammar='root ::= "yes"').json()
    assert (r["content"], r["stop_type"]) == ("yes", "eos")
    r = post(prompt="Count:", n_predict=10, grammar='root ::= "one two three"', stop=["two"]).json()
    assert (r["content"], r["stop_type"], r["stopping_word"]) == ("one ", "word", "two")


def test_json_schema_and_token_prompt(post, arbor_server):
    schema = {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}
    r = post(prompt=PROMPT, n_predict=30, temperature=0, json_schema=schema).json()
    assert isinstance(json.loads(r["content"])["city"], str)
    ids = httpx.post(arbor_server.base_url + "/tokenize", json={"content": PROMPT}).json()["tokens"]
    by_ids = post(prompt=ids, n_predict=4, temperature=0).json()
    assert by_ids["content"] == post(prompt=PROMPT, n_predict=4, temperature=0).json()["content"]


def test_logit_bias_pairs(post):
    first = post(prompt=PROMPT, n_predict=1, temperature=0, return_tokens=True).json()["tokens"][0]
    banned = post(prompt=PROMPT, n_predict=1, temperature=0, return_tokens=True,
                  logit_bias=[[first, -100]]).json()["tokens"][0]
    assert banned != first


@pytest.mark.parametrize("body,param", [
    ({"prompt": PROMPT, "n_probs": 21}, "n_probs"),
    ({"prompt": PROMPT, "n": 2}, "n"),
    ({"prompt": PROMPT, "n_predict": 0}, "n_predict"),
    ({"prompt": PROMPT, "n_predict": -2}, "n_predict"),
    ({"n_predict": 4}, "prompt"),
    ({"prompt": PROMPT, "grammar": "root ::= nope"}, "grammar"),
    ({"prompt": PROMPT, "logit_bias": [[1]]}, "logit_bias"),
])
def test_bad_requests_are_400(post, body, param):
    r = post(**body)
    assert r.status_code == 400 and r.json()["error"]["param"] == param, r.text
