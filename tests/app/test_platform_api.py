"""The LangGraph Platform API subset (app/platform/), driven by the real `langgraph-sdk` client
over HTTP against a running workbench, on a scripted model (tests/fakes/scripted_openai.py), on
SQLite and PostgreSQL. Every answer is validated against `langgraph_sdk.schema`'s types, and
every run is checked in the workbench's own API too: one store, seen from both sides."""

from __future__ import annotations

import asyncio
import contextlib
import time
import typing

import httpx
import pytest
from langgraph_sdk import get_client, schema

from app.main import create_app
from app.platform.wire import assistant_id
from tests.app.support import PROPOSALS_EXECUTED, lab_catalog, live_server, make_settings
from tests.fakes.scripted_openai import ScriptedReply, scripted_server, tool_call
from tests.workbench_auth import AUTH_HEADERS, WORKBENCH_TOKEN

pytestmark = pytest.mark.usefixtures("workbench_database")

PROPOSAL = {"action": "restart_service", "target": "event-api", "reason": "queue stuck"}


def conforms(kind, value):
    """`value` has the shape of `langgraph_sdk.schema`'s TypedDict `kind` (or a list of them):
    every required key, no unknown one, and the fields typed as TypedDicts of the schema
    (checkpoints, interrupts, tasks) checked the same way."""
    if typing.get_origin(kind) is list:
        assert isinstance(value, list), value
        return [conforms(typing.get_args(kind)[0], v) for v in value] and value
    assert isinstance(value, dict), value
    # the schema module's annotations are strings: NotRequired[...] is read from them
    loose = {
        k for cls in kind.__mro__ for k, a in getattr(cls, "__annotations__", {}).items()
        if getattr(a, "__forward_arg__", str(a)).startswith("NotRequired")}
    required = set(kind.__required_keys__) - loose
    optional = set(kind.__optional_keys__) | loose
    assert required <= set(value), f"{kind.__name__} lacks {required - set(value)}"
    assert set(value) <= required | optional, f"{kind.__name__} has unknown {set(value) - required - optional}"
    nested = {"checkpoint": schema.Checkpoint, "parent_checkpoint": schema.Checkpoint,
              "interrupts": list[schema.Interrupt], "tasks": list[schema.ThreadTask]}
    for key, inner in nested.items():
        if key in value and value[key] is not None and key in required | optional and not (
                kind is schema.Thread and key == "interrupts"):
            conforms(inner, value[key])
    if kind is schema.Thread:
        for items in value["interrupts"].values():
            conforms(list[schema.Interrupt], items)
    return value


@contextlib.contextmanager
def platform(tmp_path, replies):
    with scripted_server(replies) as fake:
        app = create_app(make_settings(tmp_path, fake.base_url), lab_catalog())
        with live_server(app) as url:
            yield fake, url, get_client(url=f"{url}/langgraph", api_key=WORKBENCH_TOKEN)


def api(url: str, path: str, method: str = "GET", **kwargs) -> httpx.Response:
    return httpx.request(method, f"{url}/api{path}", headers=AUTH_HEADERS, timeout=30, **kwargs)


async def collect(parts) -> list:
    return [part async for part in parts]


def test_assistants_threads_and_a_streamed_run(tmp_path):
    replies = [ScriptedReply(tool_calls=[tool_call("echo", {"text": "ping"}, "c1")]),
               ScriptedReply(content="All quiet on the bench.", cached_tokens=7, cache_source="S")]

    async def scenario(client, url, fake):
        assistants = await client.assistants.search()
        conforms(list[schema.Assistant], assistants)
        assert {a["graph_id"] for a in assistants} == {"lab", "other"}
        lab = await client.assistants.get(assistant_id("lab"))
        assert lab["assistant_id"] == assistant_id("lab") and lab["name"] == "lab"
        assert (await client.assistants.get("lab"))["assistant_id"] == lab["assistant_id"]  # a graph id works too
        schemas = await client.assistants.get_schemas("lab")
        assert "messages" in schemas["input_schema"]["properties"]

        thread = conforms(schema.Thread, await client.threads.create(graph_id="lab", metadata={"title": "bench"}))
        assert thread["status"] == "idle" and thread["metadata"]["graph_id"] == "lab"
        parts = await collect(client.runs.stream(
            thread["thread_id"], "lab", input={"messages": [{"role": "user", "content": "How is the bench?"}]},
            stream_mode=["values", "updates", "messages-tuple", "custom"]))
        events = [p.event for p in parts]
        assert events[0] == "metadata"
        run_id = parts[0].data["run_id"]
        updates = [p.data for p in parts if p.event == "updates"]
        assert [next(iter(u)) for u in updates] == ["model", "tools", "model"]
        assert updates[1]["tools"]["messages"][0]["content"] == '{"echo":"ping"}' or "ping" in \
            updates[1]["tools"]["messages"][0]["content"]
        chunks = [p.data for p in parts if p.event == "messages"]
        assert "".join(c[0]["content"] for c in chunks).strip() == "All quiet on the bench."
        assert all(c[1]["langgraph_node"] == "model" for c in chunks)
        custom = [p.data for p in parts if p.event == "custom"]
        assert any(c["type"] == "model_call" and c["cache_source"] == "S" and c["cached_tokens"] == 7 for c in custom)
        final = [p.data for p in parts if p.event == "values"][-1]
        assert [m["type"] for m in final["messages"]] == ["human", "ai", "tool", "ai"]
        assert final["messages"][-1]["content"] == "All quiet on the bench."

        # the same turn, as the workbench's own API sees it
        turn = api(url, f"/turns/{run_id}").json()
        assert turn["status"] == "completed" and turn["branch_id"] == thread["thread_id"]
        run = conforms(schema.Run, await client.runs.get(thread["thread_id"], run_id))
        assert run["status"] == "success"
        assert [r["run_id"] for r in await client.runs.list(thread["thread_id"])] == [run_id]

        state = conforms(schema.ThreadState, await client.threads.get_state(thread["thread_id"]))
        assert state["values"]["messages"][-1]["content"] == "All quiet on the bench." and state["next"] == []
        history = conforms(list[schema.ThreadState], await client.threads.get_history(thread["thread_id"], limit=50))
        assert history[0]["checkpoint"]["checkpoint_id"] == state["checkpoint"]["checkpoint_id"]
        found = await client.threads.search(metadata={"graph_id": "lab"})
        assert thread["thread_id"] in [t["thread_id"] for t in conforms(list[schema.Thread], found)]
        assert await client.threads.search(metadata={"graph_id": "other"}) == []

        # a second run continues the thread: the model sees the first turn
        fake_replies = len(fake.requests)
        waited = await client.runs.wait(thread["thread_id"], "lab",
                                        input={"messages": [{"role": "user", "content": "And now?"}]})
        assert len(fake.requests) == fake_replies + 1
        sent = fake.requests[-1]["body"]["messages"]
        assert [m["role"] for m in sent][-2:] == ["assistant", "user"] and "All quiet" in sent[-2]["content"]
        assert waited["messages"][-1]["type"] == "ai"

    replies.append(ScriptedReply(content="Still quiet."))
    with platform(tmp_path, replies) as (fake, url, client):
        asyncio.run(scenario(client, url, fake))


def test_an_approval_is_an_interrupt_resumed_with_a_command(tmp_path):
    replies = [ScriptedReply(tool_calls=[tool_call("propose_action", PROPOSAL, "c1")]),
               ScriptedReply(content="Restart approved and noted.")]

    async def scenario(client, url, fake):
        thread = await client.threads.create(graph_id="lab")
        tid = thread["thread_id"]
        parts = await collect(client.runs.stream(tid, "lab", input={"messages": [{"role": "user", "content": "Fix"}]},
                                                 stream_mode=["values", "updates"]))
        last_values = [p.data for p in parts if p.event == "values"][-1]
        interrupts = last_values["__interrupt__"]
        conforms(list[schema.Interrupt], interrupts)
        assert interrupts[0]["value"]["tool_name"] == "propose_action"
        assert interrupts[0]["value"]["action_request"] == {"action": "propose_action", "args": PROPOSAL}
        assert [p.data for p in parts if p.event == "updates"][-1] == {"__interrupt__": interrupts}
        approval_id = interrupts[0]["id"]

        paused = conforms(schema.Thread, await client.threads.get(tid))
        assert paused["status"] == "interrupted" and paused["interrupts"][approval_id][0]["id"] == approval_id
        state = await client.threads.get_state(tid)
        assert state["next"] == ["approval"] and state["interrupts"][0]["id"] == approval_id
        assert [a["id"] for a in api(url, "/approvals").json()] == [approval_id]  # the workbench's own list

        resumed = await collect(client.runs.stream(tid, "lab", command={"resume": {"approved": True, "comment": "go"}},
                                                   stream_mode="values"))
        assert resumed[0].data["run_id"] == parts[0].data["run_id"]  # the same turn goes on
        assert resumed[-1].data["messages"][-1]["content"] == "Restart approved and noted."
        approval = api(url, f"/approvals/{approval_id}").json()
        assert approval["status"] == "approved" and approval["comment"] == "go"
        assert approval["decided_by"] == "langgraph-api"
        assert PROPOSALS_EXECUTED == []
        assert (await client.threads.get(tid))["status"] == "idle"
        with pytest.raises(httpx.HTTPStatusError) as nothing_waits:
            await client.runs.wait(tid, "lab", command={"resume": True})
        assert nothing_waits.value.response.status_code == 409

    with platform(tmp_path, replies) as (fake, url, client):
        asyncio.run(scenario(client, url, fake))


def test_copy_and_a_run_from_an_earlier_checkpoint_fork_branches(tmp_path):
    replies = [ScriptedReply(content="First answer."), ScriptedReply(content="Second answer."),
               ScriptedReply(content="Answer on the fork."), ScriptedReply(content="Answer on the copy.")]

    async def scenario(client, url, fake):
        tid = (await client.threads.create(graph_id="lab"))["thread_id"]
        await client.runs.wait(tid, "lab", input={"messages": [{"role": "user", "content": "one"}]})
        after_one = (await client.threads.get_state(tid))["checkpoint"]["checkpoint_id"]
        await client.runs.wait(tid, "lab", input={"messages": [{"role": "user", "content": "two"}]})

        created: list = []
        parts = await collect(client.runs.stream(tid, "lab", input={"messages": [{"role": "user", "content": "2b"}]},
                                                 checkpoint_id=after_one, on_run_created=created.append))
        fork = created[0]["thread_id"]
        assert fork != tid and parts[0].data["thread_id"] == fork
        assert [m["content"] for m in parts[-1].data["messages"]] == ["one", "First answer.", "2b",
                                                                      "Answer on the fork."]
        # the thread asked for is as it was; the fork is a branch of the same session
        assert [m["content"] for m in (await client.threads.get_state(tid))["values"]["messages"]][-1] == \
            "Second answer."
        fork_thread = await client.threads.get(fork)
        session_id = fork_thread["metadata"]["arbor_session_id"]
        branches = api(url, f"/sessions/{session_id}").json()["branches"]
        assert {b["id"] for b in branches} == {tid, fork}

        copy = conforms(schema.Thread, await client.threads.copy(tid))
        assert copy["thread_id"] not in (tid, fork)
        assert [m["content"] for m in copy["values"]["messages"]] == ["one", "First answer.", "two", "Second answer."]
        out = await client.runs.wait(copy["thread_id"], "lab", input={"messages": [{"role": "user", "content": "3"}]})
        assert out["messages"][-1]["content"] == "Answer on the copy."
        assert len(await client.threads.search(metadata={"arbor_session_id": session_id})) == 3

        await client.threads.delete(copy["thread_id"])
        assert len(await client.threads.search(metadata={"arbor_session_id": session_id})) == 2

    with platform(tmp_path, replies) as (fake, url, client):
        asyncio.run(scenario(client, url, fake))


def test_a_background_run_is_joined_and_a_slow_one_cancelled(tmp_path):
    replies = [ScriptedReply(content="Joined answer."),
               ScriptedReply(content=" ".join(["slow"] * 400), token_delay_s=0.05)]

    async def scenario(client, url, fake):
        tid = (await client.threads.create(graph_id="lab"))["thread_id"]
        run = conforms(schema.Run, await client.runs.create(tid, "lab",
                                                            input={"messages": [{"role": "user", "content": "a"}]}))
        joined = await client.runs.join(tid, run["run_id"])
        assert joined["messages"][-1]["content"] == "Joined answer."

        slow = await client.runs.create(tid, "lab", input={"messages": [{"role": "user", "content": "b"}]})
        deadline = time.monotonic() + 20
        while len(fake.requests) < 2:  # the slow answer is streaming
            assert time.monotonic() < deadline
            await asyncio.sleep(0.05)
        assert (await client.threads.get(tid))["status"] == "busy"
        with pytest.raises(httpx.HTTPStatusError) as busy:
            await client.runs.wait(tid, "lab", input={"messages": [{"role": "user", "content": "c"}]})
        assert busy.value.response.status_code == 409
        await client.runs.cancel(tid, slow["run_id"], wait=True)
        assert (await client.runs.get(tid, slow["run_id"]))["status"] == "interrupted"
        assert api(url, f"/turns/{slow['run_id']}").json()["status"] == "cancelled"
        state = await client.threads.get_state(tid)
        assert state["values"]["messages"][-1]["content"] == "Joined answer."  # the branch keeps its last turn
        assert (await client.runs.join(tid, slow["run_id"]))["__error__"]["error"] == "cancelled"

    with platform(tmp_path, replies) as (fake, url, client):
        asyncio.run(scenario(client, url, fake))


def test_the_api_key_is_the_workbench_token(tmp_path):
    async def scenario(url):
        with pytest.raises(httpx.HTTPStatusError) as refused:
            await get_client(url=f"{url}/langgraph", api_key="wrong-token-entirely").assistants.search()
        assert refused.value.response.status_code == 401
        anonymous = httpx.get(f"{url}/langgraph/info")
        assert anonymous.status_code == 401
        bearer = httpx.get(f"{url}/langgraph/info", headers=AUTH_HEADERS)
        assert bearer.status_code == 200 and bearer.json()["flags"]["assistants"] is True

    with platform(tmp_path, []) as (_, url, __):
        asyncio.run(scenario(url))
