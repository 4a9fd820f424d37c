"""Branches on LangGraph threads: one thread per branch, forks start from a checkpoint of the
parent (a turn's end or inside a turn), retries from the last good checkpoint, and a deleted
branch takes its thread along (app/services/branches.py, app/services/branch_threads.py)."""

import pytest
from langchain_core.messages import convert_to_openai_messages

from tests.app.support import decide, make_settings, new_session, of_type, parse_sse, post_turn, workbench_client
from tests.fakes.scripted_openai import ScriptedReply, scripted_server, tool_call


def _reply(body):
    """A tool call for "use the tool", an answer naming the last message otherwise."""
    last = body["messages"][-1]
    if last["role"] == "user" and "use the tool" in last["content"]:
        return ScriptedReply(tool_calls=[tool_call("echo", {"text": last["content"]}, f"c{len(body['messages'])}")])
    return ScriptedReply(content=f"answer to: {last['content']}")


def _state(client, branch_id: str, checkpoint_id: str | None = None) -> dict:
    """The values of the branch's thread, read through the graph (at `checkpoint_id` if given)."""
    graph = client.app.state.workbench.graph
    configurable = {"thread_id": f"branch-{branch_id}", **({"checkpoint_id": checkpoint_id} if checkpoint_id else {})}
    snapshot = client.portal.call(graph.aget_state, {"configurable": configurable})
    return {**snapshot.values, "messages": convert_to_openai_messages(snapshot.values.get("messages") or [])}


def _turns(client, sid: str) -> dict:
    return {t["id"]: t for t in client.get(f"/api/sessions/{sid}").json()["turns"]}


@pytest.mark.usefixtures("workbench_database")
def test_a_fork_from_turn_k_starts_its_thread_from_that_turns_end(tmp_path):
    with scripted_server(_reply) as fake, workbench_client(make_settings(tmp_path, fake.base_url)) as client:
        session = new_session(client)
        sid, main = session["id"], session["active_branch_id"]
        t1 = post_turn(client, sid, "first")[-1]["turn_id"]
        post_turn(client, sid, "second")
        turns = _turns(client, sid)
        assert turns[t1]["start_checkpoint_id"] and turns[t1]["end_checkpoint_id"]
        after_t1 = _state(client, main, turns[t1]["end_checkpoint_id"])["messages"]
        assert after_t1 == [{"role": "user", "content": "first"}, {"role": "assistant", "content": "answer to: first"}]

        fork = client.post(f"/api/sessions/{sid}/branches", json={"turn_id": t1, "name": "alt"}).json()
        assert fork["fork_checkpoint_id"] == turns[t1]["end_checkpoint_id"]
        assert _state(client, fork["id"])["messages"] == after_t1  # the new thread holds turn 1's end

        alt = post_turn(client, sid, "alternative second")[-1]
        assert alt["type"] == "final"
        assert fake.bodies[-1]["messages"][1:] == [*after_t1, {"role": "user", "content": "alternative second"}]
        assert _state(client, fork["id"])["messages"] == [
            *after_t1, {"role": "user", "content": "alternative second"},
            {"role": "assistant", "content": "answer to: alternative second"}]
        # the parent's thread did not move, and the turn recorded only its own messages
        assert [m["content"] for m in _state(client, main)["messages"] if m["role"] == "user"] == ["first", "second"]
        assert _turns(client, sid)[alt["turn_id"]]["messages"] == _state(client, fork["id"])["messages"][2:]

        history = client.get(f"/api/sessions/{sid}/branches/{fork['id']}").json()
        assert history["messages"] == _state(client, fork["id"])["messages"]


@pytest.mark.usefixtures("workbench_database")
def test_a_fork_inside_a_turn_continues_it_from_that_checkpoint(tmp_path):
    with scripted_server(_reply) as fake, workbench_client(make_settings(tmp_path, fake.base_url)) as client:
        session = new_session(client)
        sid, main = session["id"], session["active_branch_id"]
        t1 = post_turn(client, sid, "hello")[-1]["turn_id"]
        t2 = post_turn(client, sid, "please use the tool")[-1]["turn_id"]
        points = client.get(f"/api/sessions/{sid}/branches/{main}/checkpoints").json()
        assert points[0]["checkpoint_id"] == _turns(client, sid)[t2]["end_checkpoint_id"]
        assert all(p["source"] != "input" for p in points)
        # the checkpoint before the tool result: the model asked for the tool, the tools node is next
        before_tool = next(p for p in points if p["turn_id"] == t2 and p["next"] == ["tools"])
        assert before_tool["last_message"]["tool_calls"] == ["echo"]

        wrong = client.post(f"/api/sessions/{sid}/branches", json={"turn_id": t1,
                                                                   "checkpoint_id": before_tool["checkpoint_id"]})
        assert wrong.status_code == 400 and wrong.json()["error"]["type"] == "checkpoint_not_in_turn"
        fork = client.post(f"/api/sessions/{sid}/branches", json={"turn_id": t2,
                                                                  "checkpoint_id": before_tool["checkpoint_id"]})
        assert fork.status_code == 201, fork.text
        branch = fork.json()
        assert branch["head_turn_id"] == t1 and branch["fork_turn_id"] == t2
        state = _state(client, branch["id"])
        assert state["messages"][-1]["tool_calls"][0]["function"]["name"] == "echo"

        # its first turn continues turn 2 (no other message), from the tool on
        other = client.post(f"/api/sessions/{sid}/turns", json={"message": "something else", "stream": False})
        assert other.status_code == 409 and other.json()["error"]["type"] == "branch_continues_turn"
        calls_before = len(fake.bodies)
        events = parse_sse(client.post(f"/api/sessions/{sid}/branches/{branch['id']}/continue").text)
        assert events[0]["parent_turn_id"] == t1 and events[-1]["type"] == "final"
        assert of_type(events, "tool_result")[0]["name"] == "echo" and not of_type(events, "tool_call")
        assert len(fake.bodies) == calls_before + 1  # only the model's answer after the tool
        assert fake.bodies[-1]["messages"][1:-1] == state["messages"]  # the copied state, then the tool result
        assert fake.bodies[-1]["messages"][-1]["role"] == "tool"
        continued = _turns(client, sid)[events[0]["turn_id"]]
        assert continued["user_message"] == "please use the tool"
        assert [m["role"] for m in continued["messages"]] == ["user", "assistant", "tool", "assistant"]
        assert client.post(f"/api/sessions/{sid}/branches/{branch['id']}/continue").status_code == 409
        assert post_turn(client, sid, "and then")[-1]["type"] == "final"  # an ordinary branch now


def test_a_retry_starts_from_the_parent_turns_end_not_the_failed_turns_state(tmp_path):
    replies = [ScriptedReply(content="First answer."),
               ScriptedReply(tool_calls=[tool_call("echo", {"text": "x"}, "c1")]),
               ScriptedReply(status=503),  # the second turn fails after its tool ran
               ScriptedReply(content="Second answer.")]
    with scripted_server(replies) as fake, workbench_client(make_settings(tmp_path, fake.base_url)) as client:
        session = new_session(client)
        sid, main = session["id"], session["active_branch_id"]
        t1 = post_turn(client, sid, "first")[-1]["turn_id"]
        failed = post_turn(client, sid, "second")
        assert failed[-1]["type"] == "error" and of_type(failed, "tool_result")
        # the thread advanced inside the failed turn (assistant tool call, tool result) ...
        assert [m["role"] for m in _state(client, main)["messages"]][-3:] == ["user", "assistant", "tool"]

        retry = parse_sse(client.post(f"/api/turns/{failed[0]['turn_id']}/retry").text)
        assert retry[-1]["type"] == "final"
        # ... but the retry starts from turn 1's end: one "second", no tool call of the failed turn
        assert fake.bodies[-1]["messages"][1:] == [
            {"role": "user", "content": "first"}, {"role": "assistant", "content": "First answer."},
            {"role": "user", "content": "second"}]
        turns = _turns(client, sid)
        assert turns[retry[0]["turn_id"]]["start_checkpoint_id"] == turns[t1]["end_checkpoint_id"]
        assert turns[failed[0]["turn_id"]]["start_checkpoint_id"] == turns[t1]["end_checkpoint_id"]
        assert turns[failed[0]["turn_id"]]["end_checkpoint_id"] is None
        assert [m["content"] for m in _state(client, main)["messages"]] == [
            "first", "First answer.", "second", "Second answer."]


def test_delete_branch(tmp_path, workbench_database):
    settings = make_settings(tmp_path, "http://placeholder/v1")
    with scripted_server(_reply) as fake, \
            workbench_client(settings.model_copy(update={"llm_base_url": fake.base_url})) as client:
        session = new_session(client)
        sid, main = session["id"], session["active_branch_id"]
        t1 = post_turn(client, sid, "first")[-1]["turn_id"]
        child = client.post(f"/api/sessions/{sid}/branches", json={"turn_id": t1}).json()
        c1 = post_turn(client, sid, "on the child")[-1]["turn_id"]
        grandchild = client.post(f"/api/sessions/{sid}/branches", json={"turn_id": c1}).json()
        post_turn(client, sid, "on the grandchild")
        threads = {f"branch-{b}" for b in (main, child["id"], grandchild["id"])}
        assert workbench_database.checkpoint_threads(settings) == threads

        refused = client.delete(f"/api/sessions/{sid}/branches/{main}")
        assert refused.status_code == 409 and refused.json()["error"]["type"] == "branch_is_main"
        refused = client.delete(f"/api/sessions/{sid}/branches/{child['id']}")
        assert refused.status_code == 409 and refused.json()["error"]["type"] == "branch_has_children"
        assert grandchild["name"] in refused.json()["error"]["message"]

        hints_before = len(fake.hints)
        assert client.delete(f"/api/sessions/{sid}/branches/{grandchild['id']}").status_code == 204
        assert fake.hints[hints_before:] == [{"session": f"{sid}/{grandchild['id']}", "state": "done"}]
        assert client.delete(f"/api/sessions/{sid}/branches/{child['id']}").status_code == 204
        assert workbench_database.checkpoint_threads(settings) == {f"branch-{main}"}
        detail = client.get(f"/api/sessions/{sid}").json()
        assert [b["id"] for b in detail["branches"]] == [main] and detail["active_branch_id"] == main
        assert [t["id"] for t in detail["turns"]] == [t1]
        assert client.get(f"/api/turns/{c1}").status_code == 404
        missing = client.delete(f"/api/sessions/{sid}/branches/{child['id']}")
        assert missing.status_code == 404 and missing.json()["error"]["type"] == "unknown_branch"
        assert post_turn(client, sid, "main goes on")[-1]["type"] == "final"


def test_each_turn_on_a_thread_starts_with_no_decisions(tmp_path):
    """A decision of an earlier turn must not answer a later proposal that reuses its call id
    (the `decisions` reducer merges; the turn input overwrites it)."""
    proposal = {"action": "restart_service", "target": "pump", "reason": "stuck"}

    def reply(body):
        last = body["messages"][-1]
        if last["role"] == "user":
            return ScriptedReply(tool_calls=[tool_call("propose_action", proposal, "p1")])
        return ScriptedReply(content="done")

    with scripted_server(reply) as fake, workbench_client(make_settings(tmp_path, fake.base_url)) as client:
        sid = new_session(client)["id"]
        for message in ("restart it", "restart it again"):
            request = post_turn(client, sid, message)[-1]
            assert request["type"] == "approval_request", request  # asked each time
            assert decide(client, request["approval_id"], True)[-1]["type"] == "final"


def _state_waiting_on(target: tuple) -> dict:
    """A state that, copied with the writer of `target`, must wait on `target` again."""
    from langchain_core.messages import AIMessage, HumanMessage
    call = AIMessage("", tool_calls=[{"id": "c1", "name": "echo", "args": {"text": "x"}}])
    base = {"messages": [HumanMessage("use the tool"), call], "steps": 1, "max_steps": 3, "awaiting": [],
            "decisions": {}}
    if target == ("approval",):
        return {**base, "awaiting": ["c1"]}
    if target == ("budget_exhausted",):
        return {**base, "steps": 3}
    return base


async def test_the_writer_of_each_waiting_point_is_read_from_the_graph_and_restores_it():
    """`_WRITER_OF` comes from app/agent/graph.py's edges; copying a state with each writer as
    `as_node` leaves the copy waiting on the same node (the contract forks rely on)."""
    from langgraph.checkpoint.memory import InMemorySaver

    from app.agent.graph import build_graph
    from app.services.branch_threads import _WRITER_OF, thread_config, writers_of

    graph = build_graph(checkpointer=InMemorySaver())
    assert writers_of(graph) == _WRITER_OF
    assert set(_WRITER_OF) == {(), ("model",), ("tools",), ("approval",), ("budget_exhausted",)}
    for n, (target, writer) in enumerate(sorted(_WRITER_OF.items())):
        config = await graph.aupdate_state(thread_config(f"t{n}"), _state_waiting_on(target), as_node=writer)
        assert tuple((await graph.aget_state(config)).next) == target, (target, writer)
