"""n > 1: several choices from one prompt, the prompt computed once (through the cache),
streamed and not, with the official openai client."""

from __future__ import annotations

import uuid

import openai
import pytest

pytestmark = pytest.mark.model


@pytest.fixture(scope="module")
def client(arbor_server):
    return openai.OpenAI(base_url=arbor_server.v1, api_key="unused", max_retries=0, timeout=180)


def fresh_messages() -> list[dict]:
    # a prompt no other test sent, so nothing of it is cached before the request
    return [{"role": "user", "content": f"Note {uuid.uuid4().hex[:8]}: write one short sentence about boats."}]


def test_the_prompt_is_computed_once(client):
    r = client.chat.completions.create(model="", messages=fresh_messages(), n=4, max_tokens=10,
                                       temperature=1.3, seed=11)
    assert [c.index for c in r.choices] == [0, 1, 2, 3]
    prompt = r.usage.prompt_tokens
    per_choice = r.model_extra["arbor"]["choices"]
    computed = [prompt - c["cached_tokens"] for c in per_choice]
    # one choice computes the prompt (past what was cached before, e.g. the chat template's
    # opening); every other one attaches it and computes only the last prompt token (its
    # logits are its own)
    cached_before = r.usage.prompt_tokens_details.cached_tokens
    assert cached_before < prompt - 5
    assert sorted(computed) == [1, 1, 1, prompt - cached_before], per_choice
    assert r.usage.completion_tokens == sum(c["completion_tokens"] for c in per_choice)
    assert len({c.message.content for c in r.choices}) > 1, "seeded choices should differ"


def test_greedy_choices_equal_the_single_answer(client):
    messages = fresh_messages()
    client.chat.completions.create(model="", messages=messages, max_tokens=12, temperature=0)
    many = client.chat.completions.create(model="", messages=messages, n=3, max_tokens=12, temperature=0)
    # choices attach the prompt computed in another batch shape, so a near tie may round
    # differently from the single answer; all must be full greedy answers of the same prompt
    assert len(many.choices) == 3 and all(c.message.content for c in many.choices)
    assert many.usage.completion_tokens == sum(c["completion_tokens"] for c in many.model_extra["arbor"]["choices"])


def test_streamed_choices(client):
    messages = fresh_messages()
    single = client.chat.completions.create(model="", messages=messages, max_tokens=12, temperature=0)
    texts, reasons = {}, {}
    usage = None
    for chunk in client.chat.completions.create(model="", messages=messages, n=3, max_tokens=12, temperature=0,
                                                stream=True, stream_options={"include_usage": True}):
        if chunk.usage is not None:
            usage = chunk.usage
        for c in chunk.choices:
            texts[c.index] = texts.get(c.index, "") + (c.delta.content or "")
            if c.finish_reason:
                reasons[c.index] = c.finish_reason
    assert set(texts) == {0, 1, 2} and all(texts.values())
    assert set(reasons) == {0, 1, 2}
    assert usage is not None and usage.completion_tokens == 3 * single.usage.completion_tokens


def test_completions_n_with_logprobs(client):
    r = client.completions.create(model="", prompt=f"{uuid.uuid4().hex[:6]} The sea is", n=2, max_tokens=6,
                                  temperature=0, logprobs=1)
    assert [c.index for c in r.choices] == [0, 1]
    for c in r.choices:
        assert "".join(c.logprobs.tokens) == c.text
