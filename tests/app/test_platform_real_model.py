"""The LangGraph Platform API and the OTLP export against the real stack: the real `langgraph-sdk`
client drives the running workbench (uvicorn, HTTP) on arbor-server with the embedded model, and
both export their spans to a real OTLP/HTTP receiver the test starts (tests/fakes/otlp_collector.py).

The 135M model does not pick tools by itself, so the runs that need a tool name it (the run's
`context`: tool_choice); the assertions are about structure, not wording.
"""

from __future__ import annotations

import asyncio

import httpx
import pytest
from langgraph_sdk import get_client

from app.main import create_app
from app.settings import WorkbenchSettings
from app.telemetry import otlp
from tests.app.real_backends import real_backends
from tests.app.support import forced_turn_rejecting_proposals, live_server
from tests.app.test_e2e_real_model import _real_catalog
from tests.fakes.otlp_collector import OtlpCollector
from tests.workbench_auth import AUTH_HEADERS, WORKBENCH_TOKEN

pytestmark = pytest.mark.model

PROPOSE = {"type": "function", "function": {"name": "propose_action"}}
QUESTIONS = ("Propose to restart edge-event-api. Reason: queue stuck.",
             "Restart redis because it is down.", "The event API is failing.")


@pytest.fixture(scope="module")
def stack(tmp_path_factory):
    """arbor-server and the incident service (subprocesses), the collector, and the workbench
    (in this process, served over HTTP), all exporting to the collector."""
    with OtlpCollector() as collector, pytest.MonkeyPatch.context() as env:
        env.setenv("OTEL_EXPORTER_OTLP_ENDPOINT", collector.endpoint)
        env.setenv("OTEL_BSP_SCHEDULE_DELAY", "200")
        env.delenv("OTEL_SERVICE_NAME", raising=False)
        env.delenv("DATABASE_URL", raising=False)
        with real_backends(tmp_path_factory.mktemp("platform-logs"), ["--parallel", "2"]) as urls:
            settings = WorkbenchSettings(_env_file=None, llm_base_url=urls["llm"],
                                         incident_base_url=urls["incident"],
                                         data_dir=tmp_path_factory.mktemp("platform-var"), llm_timeout_s=300,
                                         llm_max_tokens=256, llm_temperature=0.0, step_budget=3)
            with live_server(create_app(settings, _real_catalog())) as url:
                yield {"url": url, "collector": collector, "llm": urls["llm"]}


def test_langgraph_sdk_drives_a_scenario_end_to_end(stack):
    url = stack["url"]

    async def scenario():
        client = get_client(url=f"{url}/langgraph", api_key=WORKBENCH_TOKEN, timeout=600)
        assistants = await client.assistants.search()
        assert {a["graph_id"] for a in assistants} >= {"edge_incident", "story_writer", "financial_research"}

        # a streamed run whose first step must propose an action: it stops at the approval. The small
        # model may ramble inside the proposal's arguments until max_tokens cuts them (issue 59,
        # item 4: such a call is answered with an error, no approval): then a new thread, another ask
        for question in QUESTIONS:
            tid = (await client.threads.create(graph_id="edge_incident"))["thread_id"]
            parts = [p async for p in client.runs.stream(
                tid, "edge_incident", input={"messages": [{"role": "user", "content": question}]},
                context={"tool_choice": PROPOSE}, stream_mode=["values", "updates", "messages-tuple"])]
            assert parts[0].event == "metadata"
            values = [p.data for p in parts if p.event == "values"]
            assert values[0]["messages"][-1]["type"] == "human"
            interrupts = values[-1].get("__interrupt__")
            if interrupts:
                break
        assert interrupts, f"no interrupt: {[p.event for p in parts]} {values[-1]['messages'][-1]}"
        assert interrupts[0]["value"]["tool_name"] == "propose_action"
        assert (await client.threads.get(tid))["status"] == "interrupted"

        # the operator's answer, as a LangGraph Command: the same turn goes on to an answer
        resumed = [p async for p in client.runs.stream(tid, "edge_incident",
                                                       command={"resume": {"approved": False, "comment": "not now"}},
                                                       stream_mode="values")]
        final = resumed[-1].data
        assert final["messages"][-1]["type"] == "ai" and "__interrupt__" not in final
        tool_answers = [m for m in final["messages"] if m["type"] == "tool"]
        assert any("rejected" in m["content"] for m in tool_answers)
        run_id = parts[0].data["run_id"]
        turn = httpx.get(f"{url}/api/turns/{run_id}", headers=AUTH_HEADERS).json()
        assert turn["status"] == "completed" and turn["branch_id"] == tid  # the workbench's own record of it
        after_first = (await client.threads.get_state(tid))["checkpoint"]["checkpoint_id"]

        # a second turn, then a fork from the end of the first: a new thread (an Arbor branch)
        await client.runs.wait(tid, "edge_incident", input={"messages": [{"role": "user", "content": "Summarise."}]})
        created: list = []
        forked = [p async for p in client.runs.stream(
            tid, "edge_incident", input={"messages": [{"role": "user", "content": "What would you check first?"}]},
            checkpoint_id=after_first, on_run_created=created.append, stream_mode="values")]
        fork_id = created[0]["thread_id"]
        assert fork_id != tid and forked[-1].data["messages"][-1]["type"] == "ai"
        humans = [m["content"] for m in forked[-1].data["messages"] if m["type"] == "human"]
        assert humans == [question, "What would you check first?"]
        session_id = (await client.threads.get(fork_id))["metadata"]["arbor_session_id"]
        branches = httpx.get(f"{url}/api/sessions/{session_id}", headers=AUTH_HEADERS).json()["branches"]
        assert {b["id"] for b in branches} == {tid, fork_id}

        # a background run, cancelled while it runs: the branch keeps its last turn
        before = (await client.threads.get_state(fork_id))["checkpoint"]["checkpoint_id"]
        run = await client.runs.create(fork_id, "edge_incident",
                                       input={"messages": [{"role": "user", "content": "Write a long report."}]})
        await client.runs.cancel(fork_id, run["run_id"], wait=True)
        assert (await client.runs.get(fork_id, run["run_id"]))["status"] == "interrupted"
        assert (await client.threads.get_state(fork_id))["checkpoint"]["checkpoint_id"] == before
        assert (await client.threads.get(fork_id))["status"] == "idle"

    asyncio.run(scenario())


def test_a_turns_trace_holds_the_servers_request_spans(stack):
    collector = stack["collector"]
    with httpx.Client(base_url=stack["url"], headers=AUTH_HEADERS, timeout=600) as client:
        session = client.post("/api/sessions", json={"scenario": "financial_research"}).json()
        events = forced_turn_rejecting_proposals(client, session["id"], "Which company has the highest margin?")
        turn_id = events[0]["turn_id"]
        assert events[-1]["type"] == "final"
    trace_id = f"{otlp.turn_trace_id(turn_id):032x}"

    def complete(spans):
        turn = [s for s in spans if s["trace_id"] == trace_id]
        chats = [s for s in turn if s["service"] == "arbor-workbench" and s["name"].startswith("chat")]
        served = [s for s in turn if s["service"] == "arbor-server"]
        return len(chats) >= 2 and len(served) >= len(chats)

    spans = [s for s in collector.wait_for(complete, timeout_s=60) if s["trace_id"] == trace_id]
    chats = {s["span_id"]: s for s in spans if s["service"] == "arbor-workbench" and s["name"].startswith("chat")}
    served = [s for s in spans if s["service"] == "arbor-server"]
    tools = [s for s in spans if s["name"].startswith("execute_tool")]
    assert tools, [s["name"] for s in spans]
    assert any(s["name"].startswith("invoke_agent") for s in spans)
    # each server span is the child of the workbench's span of the same model call
    assert {s["parent_span_id"] for s in served} <= set(chats)
    for span in served:
        chat = chats[span["parent_span_id"]]
        assert span["attributes"]["gen_ai.usage.input_tokens"] == chat["attributes"]["gen_ai.usage.input_tokens"]
        assert span["attributes"]["gen_ai.usage.cache_read.input_tokens"] == \
            chat["attributes"]["gen_ai.usage.cache_read.input_tokens"]
        assert "arbor.cache.source" in span["attributes"] and "arbor.speculative.draft_tokens" in span["attributes"]
        assert span["start_ns"] >= chat["start_ns"] - 50_000_000  # (clocks of one machine)
    # cached tokens per step: the second model call reuses the first one's prefix
    steps = sorted(chats.values(), key=lambda s: s["start_ns"])
    assert all("gen_ai.usage.cache_read.input_tokens" in s["attributes"] for s in steps)
    assert steps[1]["attributes"]["gen_ai.usage.cache_read.input_tokens"] > 0
    assert steps[1]["attributes"]["arbor.cache.source"] in ("A", "S", "H", "D", "R")
