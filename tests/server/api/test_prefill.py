"""Assistant prefill and malformed message orders over real HTTP (openai client)."""

from __future__ import annotations

import httpx
import openai
import pytest

from tests.server.near_tie import chat_steps, completion_steps, first_parting, parting_problem

pytestmark = pytest.mark.model

ASK = {"role": "user", "content": "List three fruits."}
PREFILL = {"role": "assistant", "content": "Here are three fruits: apple,"}


@pytest.fixture(scope="module")
def client(arbor_server):
    return openai.OpenAI(base_url=arbor_server.v1, api_key="unused", max_retries=0, timeout=120)


def test_final_assistant_message_is_continued(client, arbor_server):
    r = client.chat.completions.create(model="", messages=[ASK, PREFILL], max_tokens=8, temperature=0,
                                       logprobs=True, top_logprobs=5)
    # The prompt is the rendered conversation before the prefill, then the prefill text itself
    head = httpx.post(arbor_server.base_url + "/apply-template", json={"messages": [ASK]}).json()["prompt"]
    text = head + PREFILL["content"]
    n = len(httpx.post(arbor_server.base_url + "/tokenize", json={"content": text}).json()["tokens"])
    assert r.usage.prompt_tokens == n
    # ... and the answer is only the continuation: what a raw completion of that text gives
    raw = client.completions.create(model="", prompt=text, max_tokens=8, temperature=0, logprobs=5)
    # the second request reuses the first's prompt KV, computed in another batch shape (near_tie.py)
    chat, completion = chat_steps(r.choices[0]), completion_steps(raw.choices[0])
    assert parting_problem(chat, completion) is None, parting_problem(chat, completion)
    if first_parting([s.token for s in chat], [s.token for s in completion]) is None:
        assert r.choices[0].message.content == raw.choices[0].text
    assert not r.choices[0].message.content.startswith(PREFILL["content"])


def test_continue_final_message_false_answers_in_a_new_turn(client):
    kw = dict(model="", messages=[ASK, PREFILL], max_tokens=4, temperature=0)
    prefilled = client.chat.completions.create(**kw)
    new_turn = client.chat.completions.create(**kw, extra_body={"continue_final_message": False})
    # the closed message costs its end-of-turn, and a new assistant header opens
    assert new_turn.usage.prompt_tokens > prefilled.usage.prompt_tokens + 2


def test_streamed_prefill(client):
    chunks = client.chat.completions.create(model="", messages=[ASK, PREFILL], max_tokens=8, temperature=0,
                                            stream=True)
    streamed = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    full = client.chat.completions.create(model="", messages=[ASK, PREFILL], max_tokens=8, temperature=0)
    assert streamed == full.choices[0].message.content


@pytest.mark.parametrize("messages,extra", [
    ([ASK, PREFILL, {"role": "assistant", "content": "banana"}], {}),
    ([ASK, {"role": "tool", "content": "42", "tool_call_id": "x"}], {}),
    ([ASK], {"continue_final_message": True}),
])
def test_malformed_orders_are_400(client, arbor_server, messages, extra):
    with pytest.raises(openai.BadRequestError) as err:
        client.chat.completions.create(model="", messages=messages, max_tokens=2, extra_body=extra)
    assert err.value.body["code"] == "invalid_message_order"
    assert httpx.get(arbor_server.base_url + "/health").json() == {"status": "ok"}
