"""llama-server's `grammar` (GBNF) and `json_schema` fields on chat and completions: the
output follows them; a grammar llama.cpp cannot use is a 400 and the server stays up."""

from __future__ import annotations

import json
import re

import httpx
import openai
import pytest

pytestmark = pytest.mark.model

YES_NO = 'root ::= "yes" | "no"'


@pytest.fixture(scope="module")
def client(arbor_server):
    return openai.OpenAI(base_url=arbor_server.v1, api_key="unused", max_retries=0, timeout=120)


def test_chat_follows_gbnf(client):
    for temperature in (0.0, 1.5):  # also when sampling would wander
        r = client.chat.completions.create(
            model="", messages=[{"role": "user", "content": "Is the sky green? Answer in French."}],
            max_tokens=8, temperature=temperature, seed=3, extra_body={"grammar": YES_NO})
        assert r.choices[0].message.content in ("yes", "no")


def test_streamed_completion_follows_gbnf(client):
    chunks = client.completions.create(model="", prompt="Write a poem about the sea:", max_tokens=6,
                                       temperature=1.0, seed=1, stream=True,
                                       extra_body={"grammar": "root ::= [0-9]+ \" apples\""})
    text = "".join(c.choices[0].text for c in chunks)
    assert re.fullmatch(r"[0-9]+( apples?| app| a| ap| appl| apple)?", text), text


def test_json_schema_field_on_completions(client):
    schema = {"type": "object", "properties": {"n": {"type": "integer"}}, "required": ["n"],
              "additionalProperties": False}
    r = client.completions.create(model="", prompt="A number as JSON:", max_tokens=20, temperature=0,
                                  extra_body={"json_schema": schema})
    assert r.choices[0].finish_reason == "stop"
    assert isinstance(json.loads(r.choices[0].text)["n"], int)


@pytest.mark.parametrize("grammar", [
    'root ::= "unclosed',            # syntax error
    'root ::= answer',               # undefined rule
    'start ::= "a"',                 # no root rule
    'root ::= root "a" | "a"',       # left recursion
])
def test_unusable_grammar_is_a_400(client, arbor_server, grammar):
    for call in (lambda: client.chat.completions.create(model="", messages=[{"role": "user", "content": "Hi"}],
                                                        max_tokens=2, extra_body={"grammar": grammar}),
                 lambda: client.completions.create(model="", prompt="Hi", max_tokens=2,
                                                   extra_body={"grammar": grammar})):
        with pytest.raises(openai.BadRequestError) as err:
            call()
        assert err.value.body["code"] == "invalid_grammar" and err.value.body["param"] == "grammar"
    assert httpx.get(arbor_server.base_url + "/health").json() == {"status": "ok"}


def test_grammar_conflicts_are_400(client):
    msgs = [{"role": "user", "content": "Hi"}]
    with pytest.raises(openai.BadRequestError, match="response_format"):
        client.chat.completions.create(model="", messages=msgs, max_tokens=2, response_format={"type": "json_object"},
                                       extra_body={"grammar": YES_NO})
    with pytest.raises(openai.BadRequestError, match="not both"):
        client.completions.create(model="", prompt="Hi", max_tokens=2,
                                  extra_body={"grammar": YES_NO, "json_schema": {"type": "object"}})
