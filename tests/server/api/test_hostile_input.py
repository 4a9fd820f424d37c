"""Hostile requests against the real server (issue 14): each gets a 4xx with a readable
OpenAI-format error, the process stays up, and the slots' KV is exactly what it was before.
A few inputs that look hostile but are valid (a surrogate pair, NUL inside text, unknown fields
with absurd values) must be answered normally; they are checked the same way, bar the status.
test_bad_input.py holds the older, ordinary mistakes; together they cover 70+ kinds."""

from __future__ import annotations

import json

import httpx
import pytest

from tests.server.api.test_openai_compat import idle_slots_consistent

pytestmark = pytest.mark.model

MSG = [{"role": "user", "content": "hi"}]
CHAT = "/v1/chat/completions"
BIG = 10 * 2**20  # above the default --max-body-kib (4 MiB)


def raw(text: bytes) -> dict:
    return {"content": text, "headers": {"content-type": "application/json"}}


def chat(**fields) -> dict:
    return {"json": {"messages": MSG, "max_tokens": 2, **fields}}


def schema(s) -> dict:
    return chat(response_format={"type": "json_schema", "json_schema": {"name": "r", "schema": s}})


def tool_params(params: dict) -> dict:
    return chat(tools=[{"type": "function", "function": {"name": "f", "parameters": params}}], tool_choice="required")


def hint_headers(**headers) -> dict:
    return {**chat(), "headers": headers}


def big_body() -> bytes:
    return json.dumps({"messages": [{"role": "user", "content": "x" * BIG}]}).encode()


def in_chunks(body: bytes):
    """No Content-Length: the server has to count while it reads."""
    for i in range(0, len(body), 65536):
        yield body[i:i + 65536]


# (name, path, request kwargs or a callable making them, status, error code or param expected)
HOSTILE = [
    ("lone high surrogate", CHAT, raw(b'{"messages":[{"role":"user","content":"a\\ud800b"}]}'), 400, "invalid_unicode"),
    ("lone low surrogate", CHAT, raw(b'{"messages":[{"role":"user","content":"\\udfff"}]}'), 400, "invalid_unicode"),
    ("lone surrogate in an object key", CHAT, raw(
        b'{"messages":[{"role":"user","content":"x"}],"tools":[{"type":"function","function":{"name":"f",'
        b'"parameters":{"type":"object","properties":{"\\ud800":{"type":"string"}}}}}]}'), 400, "invalid_unicode"),
    ("lone surrogate to /tokenize", "/tokenize", raw(b'{"content":"\\ud800"}'), 400, "invalid_unicode"),
    ("invalid UTF-8 bytes", CHAT, raw(b'{"messages":[{"role":"user","content":"\xff\xfe"}]}'), 400, None),
    ("NUL in a schema property name", CHAT, schema({"type": "object", "properties": {"a\u0000": {"type": "string"}},
                                                    "required": ["a\u0000"]}), 400, "invalid_schema"),
    ("NUL in a schema enum", CHAT, schema({"enum": ["x\u0000y"]}), 400, "invalid_schema"),
    ("NUL in a schema pattern", CHAT, schema({"type": "string", "pattern": "^a\\x00$"}), 400, "invalid_schema"),
    ("10 MB body", CHAT, lambda: raw(big_body()), 413, "request_too_large"),
    ("10 MB body without length", CHAT, lambda: raw(in_chunks(big_body())), 413, "request_too_large"),
    ("JSON nested 100 deep", CHAT, raw(b'{"messages":[{"role":"user","content":"x"}],"x":' + b"[" * 100 + b"]" * 100
                                       + b"}"), 400, "too_deeply_nested"),
    ("JSON nested 100000 deep", CHAT, raw(b'{"x":' + b"[" * 100_000 + b"]" * 100_000 + b"}"), 400, "too_deeply_nested"),
    ("1000 tools", CHAT, chat(tools=[{"type": "function", "function": {"name": f"f{i}"}} for i in range(1000)]), 400,
     "too_many_tools"),
    ("2000 messages", CHAT, {"json": {"messages": MSG * 2000}}, 400, "too_many_messages"),
    ("17 stop strings", CHAT, chat(stop=[str(i) for i in range(17)]), 400, "too_many_stop"),
    ("17 stop strings, completions", "/v1/completions", {"json": {"prompt": "x", "stop": list("abcdefghijklmnopq")}},
     400, "too_many_stop"),
    ("a 100 kB stop string", CHAT, chat(stop=["x" * 100_000]), 400, "stop_too_long"),
    ("a 257-character stop string, completions", "/v1/completions", {"json": {"prompt": "x", "stop": "y" * 257}},
     400, "stop_too_long"),
    ("schema pattern unbalanced", CHAT, schema({"type": "string", "pattern": "^a)$"}),
     400, "response_format.json_schema"),
    ("schema pattern inverted range", CHAT, schema({"type": "string", "pattern": "^[z-a]$"}), 400, "invalid_schema"),
    ("schema $ref to nowhere", CHAT, schema({"$ref": "#/definitions/nope"}), 400, "response_format.json_schema"),
    ("schema remote $ref", CHAT, schema({"$ref": "https://example.com/s.json"}), 400, "response_format.json_schema"),
    ("schema unknown type", CHAT, schema({"type": "frobnicate"}), 400, "response_format.json_schema"),
    ("schema empty enum", CHAT, schema({"enum": []}), 400, "invalid_schema"),
    ("schema maxItems 100000", CHAT, schema({"type": "array", "items": {"type": "integer"}, "maxItems": 100_000}), 400,
     "invalid_schema"),
    ("schema maxLength 100000", CHAT, schema({"type": "string", "maxLength": 100_000}), 400, "invalid_schema"),
    ("schema not an object", CHAT, schema("string"), 400, "response_format.json_schema.schema"),
    ("tool parameters empty oneOf", CHAT, tool_params({"type": "object", "properties": {"a": {"oneOf": []}},
                                                       "required": ["a"]}), 400, "tools"),
    ("hint header bad state", CHAT, hint_headers(**{"X-Arbor-Cache-State": "sleeping"}), 400, "X-Arbor-Cache-State"),
    ("hint header bad pin", CHAT, hint_headers(**{"X-Arbor-Cache-Pin": "maybe"}), 400, "X-Arbor-Cache-Pin"),
    ("hint header session too long", CHAT, hint_headers(**{"X-Arbor-Session": "s" * 300}), 400, "X-Arbor-Session"),
    ("hint header session control char", CHAT, hint_headers(**{"X-Arbor-Session": "a\tb"}), 400, "X-Arbor-Session"),
    ("hint header session empty", CHAT, hint_headers(**{"X-Arbor-Session": ""}), 400, "X-Arbor-Session"),
    ("hint body pin not a boolean", CHAT, chat(cache={"session": "s", "pin": "maybe"}), 400, "cache.pin"),
    ("hint body session too long", CHAT, chat(cache={"session": "s" * 1000}), 400, "cache.session"),
    ("hint body not an object", CHAT, chat(cache=[1]), 400, "cache"),
    ("unknown field, 5000-digit number", CHAT, raw(b'{"messages":[{"role":"user","content":"x"}],"n_probs":'
                                                   + b"9" * 5000 + b"}"), 400, None),
    ("temperature NaN", CHAT, raw(b'{"messages":[{"role":"user","content":"x"}],"temperature":NaN}'), 400,
     "temperature"),
    ("max_tokens 1e400", CHAT, raw(b'{"messages":[{"role":"user","content":"x"}],"max_tokens":1e400}'), 400,
     "max_tokens"),
    ("body a JSON array", CHAT, raw(b"[1, 2]"), 400, None),
    ("body JSON null", CHAT, raw(b"null"), 400, None),
    ("messages a string", CHAT, {"json": {"messages": "hi"}}, 400, "messages"),
    ("content a number", CHAT, {"json": {"messages": [{"role": "user", "content": 5}]}}, 400, None),
    ("tools not a list", CHAT, chat(tools={"a": 1}), 400, "tools"),
    ("max_tokens a word", CHAT, chat(max_tokens="ten"), 400, "max_tokens"),
    ("stream a sentence", CHAT, chat(stream="yes please"), 400, "stream"),
    ("tool name with markup", CHAT, chat(tools=[{"type": "function", "function": {"name": "<script>"}}]), 400,
     "tools.0.function.name"),
    ("repeat_last_n negative", CHAT, chat(repeat_last_n=-1), 400, "repeat_last_n"),
    ("logit_bias negative token id", CHAT, chat(logit_bias={"-5": 1}), 400, "logit_bias"),
    ("top_logprobs beyond 64 bits", CHAT, chat(logprobs=True, top_logprobs=10**30), 400, "top_logprobs"),
    ("n negative", CHAT, chat(n=-3), 400, "n"),
    # A backslash before the closing $ escapes it: the converter used to leave the backslash
    # dangling in the grammar, which llama.cpp refused inside the engine (a 500).
    ("schema pattern ends with a backslash", CHAT, schema({"type": "string", "pattern": "^a\\$"}), 400,
     "invalid_schema"),
    ("schema pattern is one backslash", CHAT, schema({"type": "string", "pattern": "^\\$"}), 400, "invalid_schema"),
    ("schema pattern ends with three backslashes", CHAT, schema({"type": "string", "pattern": "^a\\\\\\$"}), 400,
     "invalid_schema"),
    ("schema pattern with a backslash, in a property named pattern", CHAT, schema(
        {"type": "object", "properties": {"pattern": {"type": "string", "pattern": "^x\\$"}}}), 400, "invalid_schema"),
    ("json_schema field pattern ends with a backslash", CHAT, chat(json_schema={"type": "string", "pattern": "^a\\$"}),
     400, "invalid_schema"),
    ("json_schema field pattern ends with a backslash, completions", "/v1/completions",
     {"json": {"prompt": "x", "max_tokens": 2, "json_schema": {"type": "string", "pattern": "^a\\$"}}}, 400,
     "invalid_schema"),
    ("tool parameters pattern ends with a backslash", CHAT, tool_params({"type": "object", "properties": {
        "a": {"type": "string", "pattern": "^id-\\$"}}, "required": ["a"]}), 400, "invalid_schema"),
    # issue 35: bounded requests, JSON bodies only, a Host this server answers to
    ("300 KB of tool definitions", CHAT, chat(tools=[{"type": "function", "function": {
        "name": f"f{i}", "description": "d" * 3000}} for i in range(100)]), 400, "tools_too_large"),
    ("a 100000-character grammar", CHAT, chat(grammar='root ::= "' + "a" * 100_000 + '"'), 400, "grammar_too_large"),
    ("a 100 KB response_format schema", CHAT, schema({"enum": ["x" * 100_000]}), 400, "schema_too_large"),
    ("a 100 KB json_schema, completions", "/v1/completions", {"json": {"prompt": "x", "json_schema": {
        "enum": ["x" * 100_000]}}}, 400, "schema_too_large"),
    ("5000 logit_bias entries", CHAT, chat(logit_bias={str(i): 1 for i in range(5000)}), 400, "too_many_logit_bias"),
    ("5000 logit_bias pairs, /completion", "/completion", {"json": {"prompt": "x", "logit_bias": [
        [i, 1] for i in range(5000)]}}, 400, "too_many_logit_bias"),
    ("a form-encoded body", CHAT, {"content": b"messages=hi", "headers": {
        "content-type": "application/x-www-form-urlencoded"}}, 415, "unsupported_media_type"),
    ("a text/plain body", CHAT, {"content": b'{"messages":[]}', "headers": {"content-type": "text/plain"}}, 415,
     "unsupported_media_type"),
    ("a body without Content-Type", CHAT, {"content": b'{"messages":[]}'}, 415, "unsupported_media_type"),
    ("a cache flush from a browser page", "/cache/flush", {"headers": {"Origin": "https://evil.example"}}, 415,
     "unsupported_media_type"),
    ("a cache hint as text/plain", "/cache/hint", {"content": b'{"session":"s","pin":true}', "headers": {
        "content-type": "text/plain"}}, 415, "unsupported_media_type"),
    ("a rebound Host", CHAT, {**chat(), "headers": {"Host": "attacker.example"}}, 400, "invalid_host"),
    ("a rebound Host on the flush", "/cache/flush", {"headers": {"Host": "attacker.example:8080"}}, 400,
     "invalid_host"),
]

# Valid, if odd: answered normally.
ODD_BUT_VALID = [
    # Tool parameter schemas become grammars in llama.cpp's chat layer (json-schema-to-grammar.cpp),
    # which takes a pattern it cannot read as text and writes maxItems as a bounded repetition
    # (no nesting); whatever it accepts is answered.
    ("tool parameters bad pattern", CHAT, tool_params({"type": "object", "properties": {
        "a": {"type": "string", "pattern": "(("}}, "required": ["a"]})),
    ("tool parameters maxItems 100000", CHAT, tool_params({"type": "object", "properties": {
        "a": {"type": "array", "items": {"type": "integer"}, "maxItems": 100_000}}, "required": ["a"]})),
    ("surrogate pair (emoji)", CHAT, raw(b'{"messages":[{"role":"user","content":"\\ud83d\\ude00"}],"max_tokens":2}')),
    ("NUL inside message text", CHAT,
     {"json": {"messages": [{"role": "user", "content": "a\u0000b"}], "max_tokens": 2}}),
    ("NUL in a stop string", CHAT, chat(stop=["\u0000"])),
    ("unknown fields with absurd values", CHAT, chat(n_probs=-1, best_of=10**30, frobnicate={"a": [None]})),
    ("seed beyond 64 bits", CHAT, chat(seed=2**70)),
    ("top_k beyond 64 bits", CHAT, chat(top_k=2**63)),
    ("a stop string at --max-stop-chars (256)", CHAT, chat(stop=["x" * 256])),
    ("schema pattern ending in an escaped backslash", CHAT, schema({"type": "string", "pattern": "^a\\\\$"})),
]


def kv_state(base_url: str) -> list[dict]:
    """What the slots hold; a refused request must not change any of it."""
    return [{k: s[k] for k in ("id", "n_past", "kv_pos_max", "n_requests")} for s in idle_slots_consistent(base_url)]


def send(server, path: str, request) -> httpx.Response:
    kwargs = request() if callable(request) else request
    return httpx.post(server.base_url + path, timeout=120, **kwargs)


def still_up(server) -> None:
    assert server.proc.poll() is None, "arbor-server died:\n" + server.log()[-3000:]
    assert httpx.get(server.base_url + "/health", timeout=30).status_code == 200


def test_there_are_at_least_40_hostile_kinds():
    assert len({name for name, *_ in HOSTILE}) >= 40


@pytest.mark.parametrize("name,path,request_,status,expect", HOSTILE, ids=[c[0] for c in HOSTILE])
def test_hostile_request_is_refused_cleanly(arbor_server, name, path, request_, status, expect):
    before = kv_state(arbor_server.base_url)
    r = send(arbor_server, path, request_)
    assert r.status_code == status, r.text[:2000]
    err = r.json()["error"]
    assert set(err) == {"message", "type", "param", "code"} and err["type"] == "invalid_request_error"
    assert isinstance(err["message"], str) and 10 < len(err["message"]) < 1000, err
    if expect is not None:
        assert expect in (err["code"], err["param"]), err
    still_up(arbor_server)
    assert kv_state(arbor_server.base_url) == before


@pytest.mark.parametrize("name,path,request_", ODD_BUT_VALID, ids=[c[0] for c in ODD_BUT_VALID])
def test_odd_but_valid_request_is_answered(arbor_server, name, path, request_):
    r = send(arbor_server, path, request_)
    assert r.status_code == 200, r.text[:2000]
    assert r.json()["choices"][0]["message"]["content"] is not None
    still_up(arbor_server)
    idle_slots_consistent(arbor_server.base_url)


# Grammars that reach a state no token can continue, where not even end-of-generation is
# allowed: a code point above U+1FFFFF, which no UTF-8 token decodes to. llama.cpp used to
# accept a ruled-out token there and abort the whole process; the request must stop instead.
DEAD_ENDS = [
    ("at the first token", 'root ::= "\\U00200000"', 0.0, ""),
    ("after some text", 'root ::= "ab" [\\U00200000]', 0.0, "ab"),
    ("after some text, sampling", 'root ::= "ab" [\\U00200000]', 1.0, "ab"),
]


@pytest.mark.parametrize("name,grammar,temperature,text", DEAD_ENDS, ids=[c[0] for c in DEAD_ENDS])
@pytest.mark.parametrize("stream", [False, True], ids=["json", "stream"])
@pytest.mark.parametrize("route", ["completions", "chat"])
def test_a_grammar_with_no_way_forward_stops_the_request(arbor_server, name, grammar, temperature, text, stream,
                                                         route):
    body = {"max_tokens": 8, "temperature": temperature, "seed": 1, "grammar": grammar, "ignore_eos": True,
            "stream": stream}
    if route == "chat":
        body["messages"] = MSG
    else:
        body["prompt"] = "Say something:"
    r = httpx.post(f"{arbor_server.v1}/{'chat/completions' if route == 'chat' else 'completions'}", json=body,
                   timeout=120)
    assert r.status_code == 200, r.text[:2000]
    if stream:
        chunks = [json.loads(line[6:]) for line in r.text.splitlines()
                  if line.startswith("data: ") and line != "data: [DONE]"]
        choices = [c["choices"][0] for c in chunks if c.get("choices")]
        got = "".join((ch.get("delta", {}).get("content") or "") if route == "chat" else ch.get("text", "")
                      for ch in choices)
        finish = [ch["finish_reason"] for ch in choices if ch.get("finish_reason")]
        assert finish == ["stop"], chunks
    else:
        choice = r.json()["choices"][0]
        got = choice["message"]["content"] if route == "chat" else choice["text"]
        assert choice["finish_reason"] == "stop"
    assert got == text
    still_up(arbor_server)
    idle_slots_consistent(arbor_server.base_url)
