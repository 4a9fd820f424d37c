"""The context budget end to end against the scripted fake (real HTTP, real openai client):
limits read from the server, long sessions compacted, max_tokens clamped, a refused request
compacted harder and retried once, a message too long for any compaction refused clearly."""

from __future__ import annotations

import asyncio
import json

import pytest

from app.agent.context_limit import ContextLimitReader
from app.agent.context_state import ContextState
from app.agent.token_estimate import TokenEstimator, prompt_tokens_in_error, prompt_tools, request_chars
from tests.app.support import make_settings, new_session, of_type, post_turn, workbench_client
from tests.fakes.scripted_openai import ScriptedOpenAI, ScriptedReply, scripted_server, tool_call

ANSWER = "The readings look nominal apart from one pressure anomaly. " * 14  # ~840 characters


def _agent(body: dict) -> ScriptedReply:
    """A tool call when the request forces one, else a long answer."""
    if body.get("tool_choice") == "required":
        return ScriptedReply(tool_calls=[tool_call("big_table", {"rows": 40})])
    return ScriptedReply(content=ANSWER)


def _fake(**kw) -> ScriptedOpenAI:
    return ScriptedOpenAI(_agent, **kw)


def _fits(fake: ScriptedOpenAI, body: dict) -> bool:
    prompt = int(len(json.dumps(body["messages"])) / fake.chars_per_token)
    return prompt + body["max_tokens"] <= fake.n_ctx


def _limit(fake: ScriptedOpenAI, fallback: int | None = None):
    reader = ContextLimitReader(fake.base_url, "x", fallback)
    return asyncio.run(reader.get("scripted-fake"))


def test_the_limit_comes_from_props_then_models_then_the_setting():
    with _fake(n_ctx=3000) as fake:
        limit = _limit(fake, 999)
        assert (limit.n_ctx, limit.source) == (3000, "props")
    with _fake(n_ctx=5000, limit_via="models") as fake:
        limit = _limit(fake)
        assert (limit.n_ctx, limit.source) == (5000, "models")
    with _fake() as fake:
        limit = _limit(fake, 4096)
        assert (limit.n_ctx, limit.source) == (4096, "settings")
        assert _limit(fake) is None


def test_estimator_learns_from_the_server_and_from_a_refusal():
    estimator = TokenEstimator()
    messages = [{"role": "user", "content": "a" * 4000}]
    estimator.observe(messages, None, 1000)
    assert 1000 <= estimator.tokens(messages, None) <= 1150
    before = estimator.tokens(messages, None)
    estimator.tighten(messages, None, "the prompt has 2000 tokens and a slot holds 1500")
    assert estimator.tokens(messages, None) >= 2000 > before
    assert prompt_tokens_in_error("you requested 5000 tokens (4000 in the messages, 1000 in the completion)") == 4000


def test_requests_with_and_without_tools_in_the_prompt_are_calibrated_apart():
    estimator = TokenEstimator()
    messages = [{"role": "user", "content": "a" * 3000}]
    tools = [{"type": "function", "function": {"name": "t", "parameters": {"x": "b" * 3000}}}]
    assert prompt_tools(tools, "none") is None and prompt_tools(tools, "required") == tools
    estimator.observe(messages, None, 300)  # a tool-less prompt: 10 characters per token
    with_tools = estimator.tokens(messages, tools)
    assert with_tools >= request_chars(messages, tools) / 3  # still the conservative default
    estimator.observe(messages, tools, 3000)
    assert estimator.tokens(messages, None) < 400 and estimator.tokens(messages, tools) >= 3000


@pytest.mark.usefixtures("workbench_database")
def test_a_long_session_is_compacted_to_fit_and_every_turn_answers(tmp_path):
    settings = make_settings(tmp_path, "http://placeholder/v1", llm_max_tokens=300)
    with _fake(n_ctx=2200) as fake, workbench_client(settings.model_copy(update={"llm_base_url": fake.base_url})) \
            as client:
        sid = new_session(client)["id"]
        all_events = []
        for n in range(1, 9):
            events = post_turn(client, sid, f"question {n}: check the readings", force_tool=True)
            assert events[-1]["type"] == "final", events[-1]
            all_events += events
        assert all(_fits(fake, body) for body in fake.bodies), "a request exceeded the fake's context"
        assert all(0 < body["max_tokens"] <= 300 for body in fake.bodies)
        for body in fake.bodies:
            assert body["messages"][0]["role"] == "system"

        spans = client.get(f"/api/sessions/{sid}/trace").json()["spans"]
        compactions = [s for s in spans if s["kind"] == "compaction"]
        assert compactions and len(of_type(all_events, "compacted")) == len(compactions)
        for span in compactions:
            a = span["attributes"]
            assert span["name"] == "compacted"
            assert a["arbor.compaction.tokens_before"] > a["arbor.compaction.tokens_after"]
            assert a["arbor.compaction.reduced_turns"] + a["arbor.compaction.dropped_turns"] >= 1
            assert (a["arbor.context.limit"], a["arbor.context.limit_source"]) == (2200, "props")
        assert max(s["attributes"]["arbor.compaction.dropped_turns"] for s in compactions) >= 1
        last = fake.bodies[-1]["messages"]
        assert "earlier turn(s) left out" in next(m["content"] for m in last if m["role"] == "user")
        assert sum(1 for s in spans if s["kind"] == "model" and s["status"] == "error") == 0

        # a fork from turn 6 runs too, on turn 6's history
        turns = client.get(f"/api/sessions/{sid}").json()["turns"]
        sixth = next(t for t in turns if t["user_message"].startswith("question 6"))
        fork = client.post(f"/api/sessions/{sid}/branches", json={"turn_id": sixth["id"]})
        assert fork.status_code == 201
        events = post_turn(client, sid, "question 7 on the fork", force_tool=True)
        assert events[-1]["type"] == "final"
        sent = json.dumps(fake.bodies[-1]["messages"])
        assert "question 6" in sent and "question 7: check" not in sent and "question 8" not in sent
        assert _fits(fake, fake.bodies[-1])


@pytest.mark.usefixtures("workbench_database")
def test_a_refused_request_is_compacted_harder_and_retried_once(tmp_path):
    settings = make_settings(tmp_path, "http://placeholder/v1", llm_max_tokens=300)
    with _fake(n_ctx=2600) as fake, workbench_client(settings.model_copy(update={"llm_base_url": fake.base_url})) \
            as client:
        sid = new_session(client)["id"]
        for n in range(1, 4):
            assert post_turn(client, sid, f"question {n}", force_tool=True)[-1]["type"] == "final"
        fake.chars_per_token = 1.5  # the server now counts far more tokens than the workbench learned
        events = post_turn(client, sid, "question 4", force_tool=True)
        assert events[-1]["type"] == "final", events[-1]
        spans = client.get(f"/api/sessions/{sid}/trace").json()["spans"]
        failed = [s for s in spans if s["kind"] == "model" and s["status"] == "error"]
        assert len(failed) == 1 and "does not fit: the prompt has" in failed[0]["error"]
        retried = [s for s in spans if s["kind"] == "compaction" and s["attributes"]["arbor.compaction.retry"]]
        assert retried
        assert _fits(fake, fake.bodies[-1])


@pytest.mark.usefixtures("workbench_database")
def test_a_message_too_long_for_the_context_fails_the_turn_clearly(tmp_path):
    with scripted_server([ScriptedReply(content="never sent")]) as fake:
        fake.n_ctx = 300
        settings = make_settings(tmp_path, fake.base_url)
        with workbench_client(settings) as client:
            sid = new_session(client)["id"]
            events = post_turn(client, sid, "please look at this: " + "data " * 90)
            error = events[-1]
            assert error["type"] == "error" and error["error_type"] == "model_backend_context_exceeded"
            assert "context holds 300" in error["message"] and "shorten the message" in error["message"]
            assert fake.bodies == []
            preview = client.post(f"/api/sessions/{sid}/preview", json={"message": "hi " * 150})
            assert preview.status_code == 422 and "context holds 300" in preview.text


@pytest.mark.usefixtures("workbench_database")
def test_without_a_known_limit_requests_go_out_as_before(tmp_path):
    with scripted_server([ScriptedReply(content="ok")]) as fake, \
            workbench_client(make_settings(tmp_path, fake.base_url, llm_max_tokens=123)) as client:
        sid = new_session(client)["id"]
        assert post_turn(client, sid, "hello")[-1]["type"] == "final"
        assert fake.bodies[0]["max_tokens"] == 123
        spans = client.get(f"/api/sessions/{sid}/trace").json()["spans"]
        assert not [s for s in spans if s["kind"] == "compaction"]


def test_a_tool_step_and_the_answer_step_after_it_compact_alike(tmp_path):
    """The answer step (tool_choice "none": no tools in arbor-server's prompt) is estimated
    smaller than the tool step; it must still choose the same compaction, keeping one prefix."""
    from app.agent.context_budget import ContextBudget
    from app.agent.context_state import ContextState

    tools = [{"type": "function", "function": {"name": "t", "parameters": {"x": "b" * 2000}}}]
    system = {"role": "system", "content": "sys"}
    past = [m for n in range(6) for m in ({"role": "user", "content": f"q{n} " + "u" * 800},
                                          {"role": "assistant", "content": "a" * 1600})]
    conversation = [*past, {"role": "user", "content": "now"}]
    estimator = TokenEstimator()
    estimator.observe([system], tools, request_chars([system], tools) // 2)  # tool prompts: dense
    estimator.observe(conversation, None, request_chars(conversation, None) // 6)  # the others: loose
    state = ContextState(chars_per_token=estimator.ratios)
    with _fake() as fake:
        budget = ContextBudget(make_settings(tmp_path, fake.base_url, llm_max_tokens=200, llm_context_tokens=2000))
        tool_step = asyncio.run(budget.fit("m", system, conversation, len(past), tools, "required", state))
        answer_step = asyncio.run(budget.fit("m", system, conversation, len(past), tools, "none", state))
    assert tool_step.compacted
    assert tool_step.conversation == answer_step.conversation


def _context_fit(client, branch_id: str, checkpoint_id: str | None = None) -> ContextState:
    configurable = {"thread_id": f"branch-{branch_id}", **({"checkpoint_id": checkpoint_id} if checkpoint_id else {})}
    snapshot = client.portal.call(client.app.state.workbench.graph.aget_state, {"configurable": configurable})
    return ContextState.of(snapshot.values.get("context_fit"))


@pytest.mark.usefixtures("workbench_database")
def test_the_level_and_the_estimate_belong_to_the_branch_and_a_fork_inherits_them(tmp_path):
    """The fake offers no /apply-template: the workbench estimates, per branch. The level only
    rises along a branch; a fork starts at its parent's level and estimate at the fork point;
    a session whose text tokenizes differently learns its own ratio without moving another's."""
    settings = make_settings(tmp_path, "http://placeholder/v1", llm_max_tokens=300)
    with _fake(n_ctx=2200) as fake, workbench_client(settings.model_copy(update={"llm_base_url": fake.base_url})) \
            as client:
        assert client.app.state.workbench.budget.counter.offered is None
        session = new_session(client)
        sid, main = session["id"], session["active_branch_id"]
        finals = [post_turn(client, sid, f"question {n}: check the readings", force_tool=True)[-1]
                  for n in range(1, 8)]
        assert client.app.state.workbench.budget.counter.offered is False  # asked once, then estimated
        turns = {t["id"]: t for t in client.get(f"/api/sessions/{sid}").json()["turns"]}
        states = [_context_fit(client, main, turns[f["turn_id"]]["end_checkpoint_id"]) for f in finals]
        levels = [(s.level.reduced, s.level.dropped) for s in states]
        assert levels == sorted(levels) and levels[-1] > (0, 0), levels
        assert all(s.chars_per_token for s in states)

        k = next(i for i, s in enumerate(states) if s.level.reduced)
        fork = client.post(f"/api/sessions/{sid}/branches", json={"turn_id": finals[k]["turn_id"]}).json()
        assert _context_fit(client, fork["id"]) == states[k]

        fake.chars_per_token = 1.5  # another session: its text costs far more tokens per character
        other = new_session(client)
        assert post_turn(client, other["id"], "question 1: check the readings", force_tool=True)[-1]["type"] == "final"
        mine, theirs = _context_fit(client, main).chars_per_token, _context_fit(client, other["active_branch_id"])
        assert theirs.chars_per_token["tools"] < mine["tools"] * 0.8
        assert _context_fit(client, main) == states[-1]  # untouched by the other session
