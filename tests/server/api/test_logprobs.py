"""logprobs / top_logprobs (chat), logprobs (completions) and n_probs (native /completion)
on the embedded model over real HTTP, with the official openai client where it applies."""

from __future__ import annotations

import math

import httpx
import openai
import pytest

from tests.server.near_tie import NEAR_TIE_NATS, Step, first_parting, parting_problem

pytestmark = pytest.mark.model

MESSAGES = [{"role": "user", "content": "Name three colours of the rainbow."}]


@pytest.fixture(scope="module")
def client(arbor_server):
    return openai.OpenAI(base_url=arbor_server.v1, api_key="unused", max_retries=0, timeout=120)


def test_greedy_token_is_the_top_one_at_every_position(client):
    r = client.chat.completions.create(model="", messages=MESSAGES, max_tokens=24, temperature=0,
                                       logprobs=True, top_logprobs=3)
    entries = r.choices[0].logprobs.content
    assert len(entries) == r.usage.completion_tokens > 0
    assert b"".join(bytes(e.bytes) for e in entries).decode() == r.choices[0].message.content
    for e in entries:
        assert len(e.top_logprobs) == 3
        assert e.top_logprobs[0].token == e.token
        assert math.isclose(e.top_logprobs[0].logprob, e.logprob, abs_tol=1e-6)
        values = [t.logprob for t in e.top_logprobs]
        assert values == sorted(values, reverse=True) and values[0] <= 0.0
        assert sum(math.exp(v) for v in values) <= 1.0 + 1e-6


def test_stream_carries_the_same_logprobs(client):
    plain = client.chat.completions.create(model="", messages=MESSAGES, max_tokens=16, temperature=0,
                                           logprobs=True, top_logprobs=5)
    entries = []
    for chunk in client.chat.completions.create(model="", messages=MESSAGES, max_tokens=16, temperature=0,
                                                logprobs=True, top_logprobs=5, stream=True):
        if chunk.choices and chunk.choices[0].logprobs is not None:
            entries += chunk.choices[0].logprobs.content
    whole = plain.choices[0].logprobs.content
    # Each request may reuse other cells of the shared server's KV: a near-tie may flip (near_tie.py)
    streamed_steps, whole_steps = ([Step(e.token, e.logprob, {t.token: t.logprob for t in e.top_logprobs})
                                    for e in run] for run in (entries, whole))
    assert parting_problem(streamed_steps, whole_steps) is None, parting_problem(streamed_steps, whole_steps)
    same = first_parting([e.token for e in entries], [e.token for e in whole])
    for a, b in list(zip(entries, whole))[:same]:  # equal up to that arithmetic's noise
        assert math.isclose(a.logprob, b.logprob, abs_tol=NEAR_TIE_NATS), (a, b)


def test_sampled_tokens_get_their_own_logprob(client):
    r = client.chat.completions.create(model="", messages=MESSAGES, max_tokens=12, temperature=1.2, seed=7,
                                       logprobs=True)
    entries = r.choices[0].logprobs.content
    assert len(entries) == r.usage.completion_tokens
    assert all(e.logprob <= 0.0 and e.top_logprobs == [] for e in entries)


def test_without_logprobs_none_are_sent(client):
    r = client.chat.completions.create(model="", messages=MESSAGES, max_tokens=4, temperature=0)
    assert r.choices[0].logprobs is None


def test_completions_legacy_shape(client):
    r = client.completions.create(model="", prompt="The capital of France is", max_tokens=8, temperature=0,
                                  logprobs=2)
    lp = r.choices[0].logprobs
    assert "".join(lp.tokens) == r.choices[0].text
    assert len(lp.token_logprobs) == len(lp.top_logprobs) == len(lp.text_offset) == r.usage.completion_tokens
    for token, value, top in zip(lp.tokens, lp.token_logprobs, lp.top_logprobs):
        assert max(top, key=top.get) == token and math.isclose(top[token], value, abs_tol=1e-6)
    assert lp.text_offset == sorted(lp.text_offset) and lp.text_offset[0] == 0


def test_native_n_probs(arbor_server):
    r = httpx.post(arbor_server.base_url + "/completion", timeout=120, json={
        "prompt": "The capital of France is", "n_predict": 6, "temperature": 0, "n_probs": 4,
        "return_tokens": True}).json()
    probs = r["completion_probabilities"]
    assert [p["id"] for p in probs] == r["tokens"]
    for p in probs:
        assert len(p["top_logprobs"]) == 4 and p["top_logprobs"][0]["id"] == p["id"]
