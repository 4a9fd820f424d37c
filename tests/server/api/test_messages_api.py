"""Anthropic's Messages API on the real server (embedded model), through the real clients:
the `anthropic` client's messages.create / messages.stream / count_tokens, a tool_use round
trip, cache_control and the cache's usage fields, x-api-key, Anthropic's error format, and
langchain-anthropic's ChatAnthropic.bind_tools. Greedy sampling and a forced tool keep the
135M model's answers deterministic; prompts are short and max_tokens low."""

from __future__ import annotations

import uuid

import anthropic
import httpx
import pytest

from tests.server.api.test_openai_compat import idle_slots_consistent
from tests.server.conftest import start_server, stop_server

pytestmark = pytest.mark.model

GREEDY = {"temperature": 0}  # the client's create() has no sampling arguments: sent as extra body fields
ASK = [{"role": "user", "content": "Say hello."}]
WEATHER = {"name": "get_weather", "description": "Current weather of a city",
           "input_schema": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}
FORCE_WEATHER = {"type": "tool", "name": "get_weather", "disable_parallel_tool_use": True}


@pytest.fixture(scope="module")
def client(arbor_server):
    return anthropic.Anthropic(base_url=arbor_server.base_url, api_key="unused", max_retries=0, timeout=120)


def total_input(usage) -> int:
    return usage.input_tokens + usage.cache_read_input_tokens + usage.cache_creation_input_tokens


def test_create_answers_a_message_with_usage(client):
    r = client.messages.create(model="claude-sonnet-4-5", max_tokens=8, system="You are terse.", messages=ASK,
                               extra_body=GREEDY)
    assert r.id.startswith("msg_") and r.type == "message" and r.role == "assistant"
    assert r.model == "SmolLM2-135M-Instruct.Q4_1"
    assert [b.type for b in r.content] == ["text"] and r.content[0].text
    assert r.stop_reason in ("end_turn", "max_tokens") and r.stop_sequence is None
    assert 1 <= r.usage.output_tokens <= 8
    assert total_input(r.usage) == client.messages.count_tokens(model="m", system="You are terse.",
                                                                messages=ASK).input_tokens
    assert r.usage.cache_creation_input_tokens == 0  # no breakpoint


def test_stream_gives_the_same_message_as_create(client):
    kw = dict(model="m", max_tokens=10, system=[{"type": "text", "text": "You are terse."}], messages=ASK,
              extra_body=GREEDY)
    whole = client.messages.create(**kw)
    with client.messages.stream(**kw) as stream:
        kinds = [event.type for event in stream]
        final = stream.get_final_message()
    assert final.content[0].text == whole.content[0].text
    assert final.stop_reason == whole.stop_reason and final.usage.output_tokens == whole.usage.output_tokens
    assert kinds[0] == "message_start" and kinds[-1] == "message_stop"
    assert {"content_block_start", "content_block_delta", "content_block_stop", "message_delta"} <= set(kinds)
    assert final.usage.cache_read_input_tokens > 0  # the same prompt again: its final usage came in message_delta
    assert total_input(final.usage) == total_input(whole.usage)


def test_stop_sequence_is_reported(client):
    r = client.messages.create(model="m", max_tokens=20, messages=[{"role": "user", "content": "Count: 1, 2, 3,"}],
                               stop_sequences=[","], extra_body=GREEDY)
    if r.stop_reason == "stop_sequence":  # the model's greedy answer has a comma within 20 tokens
        assert r.stop_sequence == "," and "," not in r.content[0].text
    else:
        assert r.stop_reason in ("end_turn", "max_tokens") and "," not in r.content[0].text


def test_tool_use_round_trip(client):
    ask = [{"role": "user", "content": "Weather in Paris?"}]
    r = client.messages.create(model="m", max_tokens=40, tools=[WEATHER], tool_choice=FORCE_WEATHER, messages=ask,
                               extra_body=GREEDY)
    assert r.stop_reason == "tool_use"
    (call,) = [b for b in r.content if b.type == "tool_use"]
    assert call.name == "get_weather" and isinstance(call.input["city"], str) and call.id
    history = [*ask, {"role": "assistant", "content": [b.model_dump(exclude_none=True) for b in r.content]},
               {"role": "user", "content": [{"type": "tool_result", "tool_use_id": call.id, "content": "18 C, sunny"}]}]
    after = client.messages.create(model="m", max_tokens=12, tools=[WEATHER], tool_choice={"type": "none"},
                                   messages=history, extra_body=GREEDY)
    assert [b.type for b in after.content] == ["text"] and after.stop_reason in ("end_turn", "max_tokens")
    assert after.usage.cache_read_input_tokens > 0  # the first turn's prompt is this one's prefix


def test_streamed_tool_use_arrives_as_input_json_deltas(client):
    with client.messages.stream(model="m", max_tokens=40, tools=[WEATHER],
                                tool_choice={"type": "any", "disable_parallel_tool_use": True},
                                messages=[{"role": "user", "content": "Weather in Oslo?"}], extra_body=GREEDY) as s:
        deltas = [e.delta.type for e in s if e.type == "content_block_delta"]
        final = s.get_final_message()
    assert final.stop_reason == "tool_use" and "input_json_delta" in deltas
    (call,) = final.content
    assert call.type == "tool_use" and call.name == "get_weather" and isinstance(call.input["city"], str)


def test_cache_control_breakpoints_report_creation_then_reads_and_pin_the_prefix(arbor_server, client):
    system = [{"type": "text", "text": f"Session {uuid.uuid4().hex}. You answer in one short line about the "
               "weather in Norway, and never mention other countries.", "cache_control": {"type": "ephemeral"}}]
    first = client.messages.create(model="m", max_tokens=4, system=system, messages=ASK, extra_body=GREEDY)
    assert first.usage.cache_creation_input_tokens > 10  # the new system prompt was computed and is kept
    second = client.messages.create(model="m", max_tokens=4, system=system,
                                    messages=[{"role": "user", "content": "Is Oslo cold?"}], extra_body=GREEDY)
    assert second.usage.cache_read_input_tokens >= first.usage.cache_creation_input_tokens
    assert second.usage.cache_creation_input_tokens == 0  # the breakpoint prefix was read, not computed
    stats = httpx.get(arbor_server.base_url + "/cache/stats", timeout=30).json()["lifecycle"]
    assert stats["pinned"] >= 1  # the prefix up to the breakpoint is pinned (docs/server.md)


def test_count_tokens_counts_tools_and_system(client):
    plain = client.messages.count_tokens(model="m", messages=ASK).input_tokens
    with_tools = client.messages.count_tokens(model="m", messages=ASK, tools=[WEATHER], system="Be brief.").input_tokens
    assert 0 < plain < with_tools


def _post(base: str, path: str, body, headers: dict | None = None) -> httpx.Response:
    if isinstance(body, bytes):
        return httpx.post(base + path, content=body, headers={"content-type": "application/json", **(headers or {})},
                          timeout=60)
    return httpx.post(base + path, json=body, headers=headers, timeout=60)


OK = {"model": "m", "max_tokens": 4, "messages": ASK}
BAD = [
    ("missing max_tokens", {"model": "m", "messages": ASK}, 400, "max_tokens"),
    ("missing model", {"max_tokens": 4, "messages": ASK}, 400, "model"),
    ("no messages", {**OK, "messages": []}, 400, "messages"),
    ("unknown block type", {**OK, "messages": [{"role": "user", "content": [{"type": "hologram"}]}]}, 400, "hologram"),
    ("image block", {**OK, "messages": [{"role": "user", "content": [
        {"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": "AAAA"}}]}]}, 400, "image"),
    ("tool_result without its tool_use", {**OK, "messages": [{"role": "user", "content": [
        {"type": "tool_result", "tool_use_id": "nope", "content": "x"}]}]}, 400, "tool_use_id"),
    ("tool_use in a user message", {**OK, "messages": [{"role": "user", "content": [
        {"type": "tool_use", "id": "a", "name": "f", "input": {}}]}]}, 400, "assistant"),
    ("server tool", {**OK, "tools": [{"type": "web_search_20250305", "name": "web_search"}]}, 400, "web_search"),
    ("tool_choice names an unknown tool", {**OK, "tools": [WEATHER], "tool_choice": {"type": "tool", "name": "g"}},
     400, "tool_choice"),
    ("temperature above 1", {**OK, "temperature": 1.5}, 400, "temperature"),
    ("max_tokens beyond the context", {**OK, "max_tokens": 100000}, 400, "max_tokens"),
    ("too many messages", {**OK, "messages": ASK * 1100}, 400, "--max-messages"),
    ("malformed json", b'{"model": "m", "messages": [', 400, "JSON"),
    ("body not an object", [1, 2], 400, "object"),
    ("bad cache hint", {**OK, "cache": {"session": "s", "state": "sleeping"}}, 400, "cache.state"),
]


@pytest.mark.parametrize("name,body,status,needle", BAD, ids=[c[0] for c in BAD])
def test_bad_requests_get_anthropic_errors(arbor_server, name, body, status, needle):
    r = _post(arbor_server.base_url, "/v1/messages", body)
    assert r.status_code == status, r.text
    err = r.json()
    assert set(err) == {"type", "error"} and err["type"] == "error"
    assert err["error"]["type"] == "invalid_request_error" and needle in err["error"]["message"], err
    assert "Traceback" not in r.text


def test_errors_through_the_client_and_on_unknown_paths(arbor_server, client):
    with pytest.raises(anthropic.BadRequestError) as info:
        client.messages.create(model="m", max_tokens=4, messages=[{"role": "user", "content": [
            {"type": "tool_result", "tool_use_id": "x", "content": "y"}]}])
    assert info.value.body["error"]["type"] == "invalid_request_error"
    r = _post(arbor_server.base_url, "/v1/messages/batches", OK)
    assert r.status_code == 404 and r.json()["error"]["type"] == "not_found_error"
    r = httpx.post(arbor_server.base_url + "/v1/messages", content=b"x", headers={"content-type": "text/plain"})
    assert r.status_code == 415 and r.json()["type"] == "error"
    # the chat routes keep OpenAI's format
    assert set(_post(arbor_server.base_url, "/v1/chat/completions", {"messages": []}).json()) == {"error"}
    idle_slots_consistent(arbor_server.base_url)  # nothing refused left a slot or a KV cell behind


@pytest.fixture(scope="module")
def keyed_server(tmp_path_factory):
    server = start_server(tmp_path_factory.mktemp("keyed"), "--parallel", "1", "--ctx-size", "1024",
                          "--api-key", "s3cret")
    yield server
    stop_server(server)


def test_x_api_key_is_accepted_under_api_key(keyed_server):
    base = keyed_server.base_url
    good = anthropic.Anthropic(base_url=base, api_key="s3cret", max_retries=0, timeout=120)
    assert good.messages.count_tokens(model="m", messages=ASK).input_tokens > 0
    with pytest.raises(anthropic.AuthenticationError) as info:
        anthropic.Anthropic(base_url=base, api_key="wrong", max_retries=0).messages.count_tokens(model="m",
                                                                                               messages=ASK)
    assert info.value.status_code == 401 and info.value.body["error"]["type"] == "authentication_error"
    count = {"model": "m", "messages": ASK}
    assert _post(base, "/v1/messages/count_tokens", count, {"authorization": "Bearer s3cret"}).status_code == 200
    missing = _post(base, "/v1/messages/count_tokens", count)
    assert missing.status_code == 401 and missing.json()["error"]["type"] == "authentication_error"
    assert httpx.get(base + "/v1/models", headers={"x-api-key": "s3cret"}).status_code == 200  # every route


def test_langchain_chat_anthropic_binds_tools(arbor_server):
    from langchain_anthropic import ChatAnthropic
    from langchain_core.tools import tool

    @tool
    def get_weather(city: str) -> str:
        """Current weather of a city."""
        return "sunny"

    llm = ChatAnthropic(model="claude-sonnet-4-5", base_url=arbor_server.base_url, api_key="unused", max_tokens=40,
                        temperature=0, max_retries=0)
    msg = llm.bind_tools([get_weather], tool_choice="get_weather").invoke("What is the weather in Rome?")
    assert msg.tool_calls and msg.tool_calls[0]["name"] == "get_weather"
    assert isinstance(msg.tool_calls[0]["args"].get("city"), str)
