"""The agent on langchain-core: a plain `@tool` in a scenario, parallel calls through ToolNode,
and ArborChatModel as a LangChain chat model (tokens, usage, the arbor cache extension)."""

import asyncio
from typing import Annotated, TypedDict

import pytest
from langchain_core.callbacks import AsyncCallbackHandler
from langchain_core.messages import AIMessageChunk, AnyMessage, HumanMessage
from langchain_core.tools import tool
from langchain_core.utils.function_calling import convert_to_openai_tool
from langgraph.graph import START, StateGraph
from langgraph.graph.message import add_messages

from app.agent.chat_model import ArborChatModel, call_result
from app.agent.model_client import ModelAdapter
from app.scenario_catalog import ScenarioCatalog
from scenarios.scenario import Scenario
from tests.app.support import LAB_TOOLS, SYSTEM_PROMPT, make_settings, new_session, of_type, post_turn, workbench_client
from tests.fakes.scripted_openai import ScriptedReply, scripted_server, tool_call


@tool
def add(a: int, b: int) -> int:
    """Add two integers."""
    return a + b


ARRIVED: list[str] = []


@tool
async def rendezvous(name: str) -> str:
    """Wait (a little) until a second call has arrived: only calls run in parallel meet."""
    ARRIVED.append(name)
    for _ in range(300):
        if len(ARRIVED) >= 2:
            return f"{name} met"
        await asyncio.sleep(0.01)
    return f"{name} alone"


PLUGGED = Scenario(name="plugged", title="Plugged", description="LangChain tools next to workbench tools.",
                   system_prompt=SYSTEM_PROMPT, tools=(add, rendezvous, *LAB_TOOLS), starter_questions=())


@pytest.mark.usefixtures("workbench_database")
def test_plain_langchain_tools_run_through_the_graph_in_parallel(tmp_path):
    ARRIVED.clear()
    replies = [ScriptedReply(tool_calls=[tool_call("add", {"a": 2, "b": 3}, "c1"),
                                         tool_call("rendezvous", {"name": "x"}, "c2"),
                                         tool_call("rendezvous", {"name": "y"}, "c3"),
                                         tool_call("echo", {"text": "hi"}, "c4"),
                                         tool_call("add", {"a": "two"}, "c5")]),
               ScriptedReply(content="5, met, hi.")]
    with scripted_server(replies) as fake, \
            workbench_client(make_settings(tmp_path, fake.base_url), ScenarioCatalog([PLUGGED])) as client:
        session = new_session(client, "plugged")
        events = post_turn(client, session["id"], "add 2 and 3, meet, echo hi")
        assert events[-1]["type"] == "final" and events[-1]["content"] == "5, met, hi."

        first, second = fake.bodies
        assert first["tools"][:2] == [convert_to_openai_tool(add), convert_to_openai_tool(rendezvous)]
        answers = [m for m in second["messages"] if m["role"] == "tool"]
        # in the order of the calls, whatever order they finished in
        assert [m["tool_call_id"] for m in answers] == ["c1", "c2", "c3", "c4", "c5"]
        assert answers[0] == {"role": "tool", "tool_call_id": "c1", "content": "5"}
        assert answers[1]["content"] == "x met" and answers[2]["content"] == "y met"  # ran concurrently
        assert answers[3]["content"] == '{"echo":"hi"}'
        assert answers[4]["content"].startswith("Error from tool add:")  # the @tool's own validation

        results = {e["tool_call_id"]: e for e in of_type(events, "tool_result")}
        assert set(results) == {"c1", "c2", "c3", "c4", "c5"} and results["c5"]["error"]
        spans = [s for s in client.get(f"/api/sessions/{session['id']}/trace").json()["spans"] if s["kind"] == "tool"]
        assert [s["status"] for s in spans].count("error") == 1 and len(spans) == 5


def test_scenario_api_describes_and_runs_a_plain_langchain_tool(tmp_path):
    with workbench_client(make_settings(tmp_path, "http://127.0.0.1:1/v1"), ScenarioCatalog([PLUGGED])) as client:
        listed = {t["name"]: t for t in client.get("/api/scenarios/plugged").json()["tools"]}
        assert listed["add"]["parameters"] == convert_to_openai_tool(add)["function"]["parameters"]
        assert listed["add"]["requires_approval"] is False and listed["propose_action"]["requires_approval"] is True
        ran = client.post("/api/scenarios/plugged/tools/add", json={"arguments": {"a": 2, "b": 3}})
        assert ran.status_code == 200 and ran.json()["result"] == 5
        refused = client.post("/api/scenarios/plugged/tools/add", json={"arguments": {"a": "two"}})
        assert refused.status_code == 422 and "invalid arguments for add" in refused.text


class _Tokens(AsyncCallbackHandler):
    def __init__(self) -> None:
        self.tokens: list[str] = []

    async def on_llm_new_token(self, token: str, **kwargs) -> None:
        self.tokens.append(token)


async def test_chat_model_streams_tokens_and_reads_usage_and_the_cache_extension(tmp_path):
    replies = [ScriptedReply(content="one two three", cached_tokens=2, cache_source="S"),
               ScriptedReply(tool_calls=[tool_call("add", {"a": 1, "b": 2}, "t1")])]
    with scripted_server(replies) as fake:
        adapter = ModelAdapter(make_settings(tmp_path, fake.base_url))
        model = ArborChatModel(adapter=adapter)
        sink = _Tokens()
        message = await model.ainvoke("hello", config={"callbacks": [sink]}, cache_session="s1/b1")
        assert len(sink.tokens) > 1 and "".join(sink.tokens) == message.content == "one two three"
        assert message.usage_metadata["input_token_details"]["cache_read"] == 2
        assert message.response_metadata["arbor"]["cache"]["source"] == "S"
        assert message.response_metadata["arbor"]["ttft_ms"] is not None
        assert call_result(message).cached_tokens == 2
        assert fake.bodies[0]["cache"] == {"session": "s1/b1", "state": "active"}
        assert fake.requests[0]["headers"]["x-arbor-session"] == "s1/b1"

        called = await model.bind_tools([add]).ainvoke([HumanMessage("add 1 and 2")])
        assert called.tool_calls == [{"name": "add", "args": {"a": 1, "b": 2}, "id": "t1", "type": "tool_call"}]
        assert fake.bodies[1]["tools"] == [convert_to_openai_tool(add)]
        assert "cache" not in fake.bodies[1]  # no session key, no hint
        await adapter.close()


async def test_chat_model_sends_a_body_built_already_as_it_is(tmp_path):
    """The graph builds, fits and records each step's body once; the chat model sends that body."""
    with scripted_server([ScriptedReply(content="as built")]) as fake:
        adapter = ModelAdapter(make_settings(tmp_path, fake.base_url))
        body = adapter.build_body("m", [{"role": "user", "content": "built once"}], [], None, "s1/b1", max_tokens=7)
        message = await ArborChatModel(adapter=adapter).ainvoke([HumanMessage("only for the callbacks")], body=body)
        assert message.content == "as built"
        assert fake.bodies == [body] and fake.requests[0]["headers"]["x-arbor-session"] == "s1/b1"
        await adapter.close()


class _Chat(TypedDict):
    messages: Annotated[list[AnyMessage], add_messages]


async def test_langgraph_messages_stream_mode_sees_the_tokens(tmp_path):
    with scripted_server([ScriptedReply(content="streamed to langgraph")]) as fake:
        adapter = ModelAdapter(make_settings(tmp_path, fake.base_url))
        model = ArborChatModel(adapter=adapter)

        async def chat(state: _Chat) -> dict:
            return {"messages": [await model.ainvoke(state["messages"])]}

        graph = StateGraph(_Chat).add_node("chat", chat).add_edge(START, "chat").compile()
        chunks = [chunk async for chunk, _ in graph.astream({"messages": [("user", "hi")]}, stream_mode="messages")]
        assert all(isinstance(c, AIMessageChunk) for c in chunks)
        assert "".join(c.content for c in chunks) == "streamed to langgraph"
        await adapter.close()
