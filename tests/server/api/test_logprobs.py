"""logprobs / top_logprobs (chat), logprobs (completions) and n_probs (native /completion)
on the embedded model over real HTTP, with the official openai client where it applies."""

from __future__ import annotations

import math
import uuid

import httpx
import openai
import pytest

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


BATCH = 64  # the shared server's --batch-size (tests/server/conftest.py, arbor_server)
FILLER = ("Please list them in the order they take in the rainbow from the outside in and give each one a short "
          "reason why someone might like it best of all on a sunny day after rain").split()


def _messages_one_past_a_batch(base_url: str) -> list[dict]:
    """MESSAGES with words added until the prompt is one token more than a multiple of BATCH: computed
    from nothing, its last token is then a batch of its own, as it is when everything before it is reused."""
    for n in range(len(FILLER) + 1):
        messages = [{"role": "user", "content": " ".join([MESSAGES[0]["content"], *FILLER[:n]])}]
        prompt = httpx.post(base_url + "/apply-template", json={"messages": messages}, timeout=60).json()["prompt"]
        tokens = httpx.post(base_url + "/tokenize", json={"content": prompt, "parse_special": True},
                            timeout=60).json()["tokens"]
        if len(tokens) % BATCH == 1:
            return messages
    raise AssertionError("no prompt length one past a batch")


def test_stream_carries_the_same_logprobs(client, arbor_server):
    """The streamed answer's tokens and log-probabilities are the whole answer's, to the bit. The stream
    reuses the plain request's KV (its cache_salt, fresh to this test: all but the last token), and the
    prompt is one token past a multiple of the server's batch, so both computed their last token alone
    against the same cells: the same arithmetic. A restore of wrong cells would move them (on this model
    another chunking of one prompt alone moves log-probabilities by up to ~0.6 nats: docs/benchmark-notes.md,
    "Near-tie partings"). Drafting is off for both (speculative.n_max 0): its verification batches are other
    shapes."""
    messages = _messages_one_past_a_batch(arbor_server.base_url)
    extra = {"cache_salt": f"logprobs-{uuid.uuid4()}", "speculative.n_max": 0}
    kw = dict(model="", messages=messages, max_tokens=16, temperature=0, logprobs=True, top_logprobs=5,
              extra_body=extra)
    plain = client.chat.completions.create(**kw)
    assert plain.usage.prompt_tokens % BATCH == 1 and plain.usage.prompt_tokens_details.cached_tokens == 0
    entries, usage = [], None
    for chunk in client.chat.completions.create(**kw, stream=True, stream_options={"include_usage": True}):
        if chunk.choices and chunk.choices[0].logprobs is not None:
            entries += chunk.choices[0].logprobs.content
        usage = chunk.usage or usage
    assert usage.prompt_tokens_details.cached_tokens == usage.prompt_tokens - 1  # reused, but for the last token
    whole = plain.choices[0].logprobs.content
    assert [e.token for e in entries] == [e.token for e in whole]
    for a, b in zip(entries, whole, strict=True):
        assert a.logprob == b.logprob, (a, b)
        assert [(t.token, t.logprob) for t in a.top_logprobs] == [(t.token, t.logprob) for t in b.top_logprobs]


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
