"""OpenAI's Responses API on the real server (embedded model) through the real clients (`openai`'s
responses.create, the `openai-agents` Runner, LangChain's ChatOpenAI on the Responses API); the
translation, stream events and store without a model: tests/server/api/protocols/openai_responses/."""

from __future__ import annotations

import asyncio
import json

import httpx
import openai
import pytest

from tests.server.api.test_openai_compat import idle_slots_consistent

MODEL = "SmolLM2-135M-Instruct.Q4_1"
WEATHER = {"type": "function", "name": "get_weather", "description": "Weather of a city.",
           "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}


# --- the real server ---

@pytest.fixture(scope="module")
def client(arbor_server):
    return openai.OpenAI(base_url=arbor_server.v1, api_key="unused", max_retries=0, timeout=120)


@pytest.mark.model
def test_create_plain(client):
    r = client.responses.create(model=MODEL, input="Say hello.", max_output_tokens=8, temperature=0)
    assert r.object == "response" and r.id.startswith("resp_")
    assert r.status in ("completed", "incomplete") and r.output_text
    assert r.usage.input_tokens > 5 and 1 <= r.usage.output_tokens <= 8
    assert r.usage.input_tokens_details.cached_tokens >= 0
    assert r.usage.output_tokens_details.reasoning_tokens == 0
    assert r.model == MODEL


@pytest.mark.model
def test_create_streamed_with_the_clients_parser(client):
    kinds, text = [], ""
    with client.responses.create(model=MODEL, input="Count: 1, 2,", instructions="Continue counting.",
                                 max_output_tokens=6, temperature=0, stream=True) as stream:
        for event in stream:
            kinds.append(event.type)
            if event.type == "response.output_text.delta":
                text += event.delta
            last = event
    assert kinds[:2] == ["response.created", "response.in_progress"]
    assert kinds[-1] in ("response.completed", "response.incomplete")
    assert "response.output_item.added" in kinds and "response.output_text.done" in kinds
    assert last.response.output_text == text and text
    with client.responses.stream(model=MODEL, input="Say hi.", max_output_tokens=32, temperature=0) as helper:
        final = helper.get_final_response()  # the client's accumulator checks every item's identity
    assert final.output_text


@pytest.mark.model
def test_tool_round_trip_continued_with_previous_response_id(arbor_server, client):
    first = client.responses.create(model=MODEL, input="What is the weather in Paris?", tools=[WEATHER],
                                    tool_choice={"type": "function", "name": "get_weather"},
                                    parallel_tool_calls=False, max_output_tokens=40, temperature=0)
    calls = [o for o in first.output if o.type == "function_call"]
    assert len(calls) == 1 and calls[0].name == "get_weather"
    assert isinstance(json.loads(calls[0].arguments), dict)
    second = client.responses.create(model=MODEL, previous_response_id=first.id, tools=[WEATHER], tool_choice="none",
                                     input=[{"type": "function_call_output", "call_id": calls[0].call_id,
                                             "output": "sunny, 21 C"}],
                                     max_output_tokens=8, temperature=0)
    assert second.previous_response_id == first.id and second.output_text
    # the continuation's prompt extends the first one's: its KV is reused
    assert second.usage.input_tokens_details.cached_tokens >= first.usage.input_tokens - 8
    # the chain's first response names its cache session
    hint = httpx.post(arbor_server.base_url + "/cache/hint", json={"session": first.id, "state": "done"}, timeout=30)
    assert hint.json()["known"] is True
    with client.responses.stream(model=MODEL, input="What is the weather in Paris?", tools=[WEATHER],
                                 tool_choice="required", parallel_tool_calls=False, max_output_tokens=40,
                                 temperature=0, store=False) as stream:
        kinds = [e.type for e in stream]
        streamed = stream.get_final_response()
    assert "response.function_call_arguments.delta" in kinds and "response.function_call_arguments.done" in kinds
    streamed_calls = [o for o in streamed.output if o.type == "function_call"]
    assert [c.arguments for c in streamed_calls] == [calls[0].arguments]  # the same call as the whole answer
    idle_slots_consistent(arbor_server.base_url)


@pytest.mark.model
def test_repeated_prefix_is_cached(client):
    kw = dict(model=MODEL, instructions="You are a terse assistant. " * 8, input="Name a colour.",
              max_output_tokens=4, temperature=0, store=False)
    client.responses.create(**kw)
    again = client.responses.create(**kw)
    assert again.usage.input_tokens_details.cached_tokens > 0


@pytest.mark.model
def test_get_delete_and_unknown_ids(arbor_server, client):
    r = client.responses.create(model=MODEL, input="Hi", max_output_tokens=2, temperature=0)
    got = client.responses.retrieve(r.id)
    assert got.id == r.id and got.output_text == r.output_text
    props = httpx.get(arbor_server.base_url + "/props", timeout=30).json()["arbor"]["responses_store"]
    assert props["responses"] >= 1 and props["max_responses"] == 1024 and props["bytes"] > 0
    client.responses.delete(r.id)
    for call in (lambda: client.responses.retrieve(r.id), lambda: client.responses.delete(r.id),
                 lambda: client.responses.create(model=MODEL, input="Hi", previous_response_id=r.id)):
        with pytest.raises(openai.NotFoundError) as err:
            call()
        assert err.value.body["code"] == "response_not_found"
    unstored = client.responses.create(model=MODEL, input="Hi", max_output_tokens=2, store=False)
    with pytest.raises(openai.NotFoundError):
        client.responses.retrieve(unstored.id)


BAD = [
    ("unknown item type", {"input": [{"type": "computer_call", "id": "x"}]}, 400),
    ("call output without call", {"input": [{"type": "function_call_output", "call_id": "c", "output": "1"}]}, 400),
    ("image part", {"input": [{"role": "user", "content": [{"type": "input_image", "image_url": "http://x"}]}]},
     400),
    ("hosted tool", {"input": "x", "tools": [{"type": "file_search"}]}, 400),
    ("unknown previous id", {"input": "x", "previous_response_id": "resp_nope"}, 404),
    ("max_output_tokens beyond context", {"input": "x", "max_output_tokens": 100000}, 400),
    ("schema too large", {"input": "x", "text": {"format": {"type": "json_schema", "name": "n", "schema": {
        "type": "object", "description": "x" * 70000}}}}, 400),
    ("bad prompt_cache_key", {"input": "x", "prompt_cache_key": ""}, 400),
]


@pytest.mark.model
@pytest.mark.parametrize("name,body,status", BAD, ids=[b[0] for b in BAD])
def test_bad_input_gets_an_openai_error_and_leaks_nothing(arbor_server, name, body, status):
    r = httpx.post(arbor_server.v1 + "/responses", json=body, timeout=60)
    assert r.status_code == status, r.text
    err = r.json()["error"]
    assert set(err) == {"message", "type", "param", "code"} and err["message"]
    idle_slots_consistent(arbor_server.base_url)


@pytest.mark.model
def test_prompt_cache_key_is_the_cache_session(arbor_server, client):
    client.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": "Hi"}], max_tokens=2,
                                   prompt_cache_key="pck-chat-1")
    client.responses.create(model=MODEL, input="Hi", max_output_tokens=2, store=False,
                            prompt_cache_key="pck-responses-1")
    for session, known in (("pck-chat-1", True), ("pck-responses-1", True), ("pck-never-sent", False)):
        r = httpx.post(arbor_server.base_url + "/cache/hint", json={"session": session, "state": "done"}, timeout=30)
        assert r.json()["known"] is known, (session, r.json())
    bad = httpx.post(arbor_server.v1 + "/chat/completions", timeout=30, json={
        "messages": [{"role": "user", "content": "Hi"}], "prompt_cache_key": "x" * 300})
    assert bad.status_code == 400 and bad.json()["error"]["param"] == "prompt_cache_key"


@pytest.mark.model
def test_openai_agents_runner_with_a_function_tool(arbor_server):
    agents = pytest.importorskip("agents")
    from agents.models.openai_responses import OpenAIResponsesModel

    agents.set_tracing_disabled(True)
    seen: list[str] = []

    @agents.function_tool
    def get_weather(city: str) -> str:
        """The weather of a city."""
        seen.append(city)
        return f"sunny in {city}"

    async def run():
        aclient = openai.AsyncOpenAI(base_url=arbor_server.v1, api_key="unused", max_retries=0, timeout=120)
        agent = agents.Agent(
            name="weather", instructions="Answer with the weather tool.", tools=[get_weather],
            model=OpenAIResponsesModel(model=MODEL, openai_client=aclient),
            model_settings=agents.ModelSettings(tool_choice="get_weather", parallel_tool_calls=False, max_tokens=48,
                                               temperature=0),
            tool_use_behavior="stop_on_first_tool")
        return await agents.Runner.run(agent, "Weather in Paris?", max_turns=2)

    result = asyncio.run(run())
    assert len(seen) == 1 and result.final_output == f"sunny in {seen[0]}"
    assert any(item.type == "function_call" for item in result.raw_responses[0].output)


@pytest.mark.model
def test_langchain_chat_openai_on_the_responses_api(arbor_server):
    langchain_openai = pytest.importorskip("langchain_openai")

    def get_weather(city: str) -> str:
        """The weather of a city."""
        return "sunny"

    llm = langchain_openai.ChatOpenAI(model=MODEL, base_url=arbor_server.v1, api_key="unused",
                                      use_responses_api=True, max_tokens=8, temperature=0, max_retries=0)
    msg = llm.invoke("Say hello.")
    assert msg.text and msg.response_metadata["id"].startswith("resp_")
    streamed = "".join(chunk.text for chunk in llm.stream("Say hello."))
    assert streamed
    tooled = llm.model_copy(update={"max_tokens": 48}).bind_tools(
        [get_weather], tool_choice="get_weather", parallel_tool_calls=False).invoke("Weather in Rome?")
    assert tooled.tool_calls and tooled.tool_calls[0]["name"] == "get_weather"
