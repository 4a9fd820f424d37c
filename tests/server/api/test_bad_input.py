"""Every bad request gets a 4xx with an OpenAI error body; the server stays up and no
slot or KV cell leaks (checked through /slots against llama.cpp's memory after each case)."""

from __future__ import annotations

import httpx
import pytest

from tests.server.api.test_openai_compat import idle_slots_consistent

pytestmark = pytest.mark.model

OK_MSG = [{"role": "user", "content": "hi"}]
TOOL = {"type": "function", "function": {"name": "f", "parameters": {"type": "object", "properties": {}}}}

CASES = [
    ("malformed json", b'{"messages": [', 400, None),
    ("no messages", {"max_tokens": 4}, 400, "messages"),
    ("empty messages", {"messages": []}, 400, "messages"),
    ("unknown role", {"messages": [{"role": "wizard", "content": "x"}]}, 400, "messages.0.role"),
    ("user without content", {"messages": [{"role": "user"}]}, 400, "messages.0"),
    ("image part", {"messages": [{"role": "user", "content": [{"type": "image_url", "image_url": {}}]}]}, 400, None),
    ("max_tokens zero", {"messages": OK_MSG, "max_tokens": 0}, 400, "max_tokens"),
    ("max_tokens negative", {"messages": OK_MSG, "max_tokens": -5}, 400, "max_tokens"),
    ("max_tokens beyond context", {"messages": OK_MSG, "max_tokens": 100000}, 400, "max_tokens"),
    ("n above --max-choices", {"messages": OK_MSG, "n": 99}, 400, "n"),
    ("n zero", {"messages": OK_MSG, "n": 0}, 400, "n"),
    ("top_logprobs without logprobs", {"messages": OK_MSG, "top_logprobs": 2}, 400, None),
    ("top_logprobs above 20", {"messages": OK_MSG, "logprobs": True, "top_logprobs": 21}, 400, "top_logprobs"),
    ("temperature too high", {"messages": OK_MSG, "temperature": 7}, 400, "temperature"),
    ("top_p zero", {"messages": OK_MSG, "top_p": 0}, 400, "top_p"),
    ("presence penalty out of range", {"messages": OK_MSG, "presence_penalty": 3}, 400, "presence_penalty"),
    ("logit bias key not a token", {"messages": OK_MSG, "logit_bias": {"abc": 1}}, 400, "logit_bias"),
    ("logit bias token out of vocab", {"messages": OK_MSG, "logit_bias": {"999999": 1}}, 400, "logit_bias"),
    ("tool schema not an object", {"messages": OK_MSG, "tools": [{"type": "function", "function": {
        "name": "f", "parameters": {"type": "array"}}}]}, 400, None),
    ("tool required names missing", {"messages": OK_MSG, "tools": [{"type": "function", "function": {
        "name": "f", "parameters": {"type": "object", "properties": {}, "required": ["x"]}}}]}, 400, None),
    ("tool_choice names unknown tool", {"messages": OK_MSG, "tools": [TOOL], "tool_choice": {
        "type": "function", "function": {"name": "g"}}}, 400, None),
    ("tool_choice required without tools", {"messages": OK_MSG, "tool_choice": "required"}, 400, None),
    ("bad tool call arguments in history", {"messages": [{"role": "assistant", "tool_calls": [{"id": "1",
        "type": "function", "function": {"name": "f", "arguments": "{not json"}}]}]}, 400, "messages"),
    ("json_schema without schema", {"messages": OK_MSG, "response_format": {"type": "json_schema"}}, 400, None),
    ("cache hint bad state", {"messages": OK_MSG, "cache": {"session": "s", "state": "sleeping"}}, 400, None),
    ("cache hint unknown key", {"messages": OK_MSG, "cache": {"sesion": "s"}}, 400, None),
]


@pytest.mark.parametrize("name,body,status,param", CASES, ids=[c[0] for c in CASES])
def test_bad_chat_request(arbor_server, name, body, status, param):
    url = arbor_server.v1 + "/chat/completions"
    if isinstance(body, bytes):
        r = httpx.post(url, content=body, headers={"content-type": "application/json"}, timeout=60)
    else:
        r = httpx.post(url, json=body, timeout=60)
    assert r.status_code == status, r.text
    err = r.json()["error"]
    assert set(err) == {"message", "type", "param", "code"}
    assert err["message"] and err["type"]
    if param is not None:
        assert err["param"] == param, err
    idle_slots_consistent(arbor_server.base_url)


def test_prompt_longer_than_the_context(arbor_server):
    long_text = "word " * 4200  # > the 4096 cells one request may use
    r = httpx.post(arbor_server.v1 + "/chat/completions", json={"messages": [{"role": "user", "content": long_text}]},
                   timeout=60)
    assert r.status_code == 400 and r.json()["error"]["code"] == "context_length_exceeded"
    idle_slots_consistent(arbor_server.base_url)


def test_bad_completion_requests(arbor_server):
    url = arbor_server.v1 + "/completions"
    for body in ({"prompt": ""}, {"prompt": [1, 2, 999999]}, {"prompt": ["a", "b"]}, {"prompt": "x", "n": 99},
                 {"prompt": "x", "echo": True, "logprobs": 1}, {"prompt": "x", "logprobs": 21}):
        r = httpx.post(url, json=body, timeout=30)
        assert r.status_code == 400, (body, r.text)
        assert r.json()["error"]["type"] == "invalid_request_error"
    r = httpx.post(arbor_server.base_url + "/detokenize", json={"tokens": [-1]})
    assert r.status_code == 400


def test_server_still_answers_after_bad_input(arbor_server):
    r = httpx.post(arbor_server.v1 + "/chat/completions", json={"messages": OK_MSG, "max_tokens": 3}, timeout=60)
    assert r.status_code == 200 and r.json()["choices"][0]["message"]["content"] is not None
    idle_slots_consistent(arbor_server.base_url)


def test_unknown_route_is_openai_shaped_404(arbor_server):
    r = httpx.get(arbor_server.v1 + "/nothing-here")
    assert r.status_code == 404 and r.json()["error"]["type"] == "not_found_error"
