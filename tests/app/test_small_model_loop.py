"""An agent loop that survives a small model (issue 59, item 4), against the scripted fake over
real HTTP: a tool call cut by max_tokens is never run nor sent back (the step runs again with
more room, or the turn ends saying so); a forced step without a tool call says why; a call
whose arguments are no JSON object goes back with `{}` (servers refuse the raw text); one
step's tool results are fitted together to the context that remains, their full text kept as
artifacts the model reads back. The same on the real engine: tests/app/test_small_model_real.py."""

from __future__ import annotations

import json

import pytest
from sqlmodel import Session, select

from app.agent.graph import NO_TOOL_NOTE, RETRY_GROWTH
from app.agent.result_fit import water_cap
from app.db.models import Artifact
from app.scenario_catalog import ScenarioCatalog
from scenarios.scenario import Scenario
from tests.app.support import LAB, LAB_TOOLS, make_settings, new_session, of_type, post_turn, workbench_client
from tests.fakes.scripted_openai import ScriptedOpenAI, ScriptedReply, scripted_server, tool_call
from tools.artifacts import READ_ARTIFACT
from tools.base import Tool, object_schema

pytestmark = pytest.mark.usefixtures("workbench_database")  # each test on SQLite and PostgreSQL

CUT = '{"text": "a long echo that never clo'  # arguments max_tokens cut off


def _all_arguments_are_objects(bodies: list[dict]) -> None:
    """What every server accepts back: each call in each history has a JSON object as arguments."""
    for body in bodies:
        for message in body["messages"]:
            for call in message.get("tool_calls") or []:
                assert isinstance(json.loads(call["function"]["arguments"]), dict), call


def test_a_call_cut_by_max_tokens_is_retried_with_more_room_and_never_run_nor_sent_back(tmp_path):
    replies = [ScriptedReply(tool_calls=[tool_call("echo", CUT, "cut1")], finish_reason="length"),
               ScriptedReply(tool_calls=[tool_call("echo", {"text": "whole"}, "c2")]),
               ScriptedReply(content="Echoed.")]
    with scripted_server(replies) as fake, \
            workbench_client(make_settings(tmp_path, fake.base_url, llm_max_tokens=100)) as client:
        events = post_turn(client, new_session(client)["id"], "Echo something long", force_tool=True)
        assert events[-1]["type"] == "final" and events[-1]["content"] == "Echoed.", events[-1]
        (retry,) = of_type(events, "retry")
        assert retry["reason"] == "tool_call_cut" and retry["cut_at_tokens"] == 100
        assert [e["tool_call_id"] for e in of_type(events, "tool_call")] == ["c2"], "the cut call is no call"
        assert [e["tool_call_id"] for e in of_type(events, "tool_result")] == ["c2"], "and never ran"
        first, again, last = fake.bodies
        assert first["max_tokens"] == 100 and again["max_tokens"] == 100 * RETRY_GROWTH
        assert again["messages"] == first["messages"], "the step runs again from the same history"
        assert again["tool_choice"] == "required", "still the forced first step"
        assert "never clo" not in json.dumps(last["messages"]) and "cut1" not in json.dumps(last["messages"])
        _all_arguments_are_objects(fake.bodies)
        assert [e["finish_reason"] for e in of_type(events, "model_call")] == ["length", "tool_calls", "stop"]


def test_a_call_cut_again_ends_the_turn_with_a_readable_message_and_the_next_turn_goes_on(tmp_path):
    replies = [ScriptedReply(tool_calls=[tool_call("echo", CUT, "cut1")], finish_reason="length"),
               ScriptedReply(content="Let me echo.", tool_calls=[tool_call("echo", CUT, "cut2")],
                             truncated_tool_call=True),  # arbor-server's mark, whatever the finish reason
               ScriptedReply(content="Fine.")]
    with scripted_server(replies) as fake, \
            workbench_client(make_settings(tmp_path, fake.base_url, llm_max_tokens=100)) as client:
        session = new_session(client)
        events = post_turn(client, session["id"], "Echo something long", force_tool=True)
        final = events[-1]
        assert final["type"] == "final" and final["outcome"] == "tool_call_cut", final
        assert final["content"].startswith("Let me echo.")
        assert "cut off at 100 and 400 tokens (max_tokens) before its call of echo was complete" in final["content"]
        assert not of_type(events, "tool_result") and not of_type(events, "tool_call")
        turn = client.get(f"/api/sessions/{session['id']}").json()["turns"][0]
        assert turn["status"] == "completed" and [m["role"] for m in turn["messages"]] == ["user", "assistant"]

        later = post_turn(client, session["id"], "And now?")
        assert later[-1]["type"] == "final" and later[-1]["content"] == "Fine."
        history = fake.bodies[-1]["messages"]
        assert [m["role"] for m in history] == ["system", "user", "assistant", "user"]
        assert "tool_calls" not in history[2] and "cut off" in history[2]["content"]
        _all_arguments_are_objects(fake.bodies)


def test_a_reply_cut_before_its_call_had_a_name_is_retried_too(tmp_path):
    """arbor-server holds a call's markup back until its name is whole: a cut that early streams
    nothing at all (finish_reason "length", no content): no tool ran, so the step runs again."""
    replies = [ScriptedReply(content="", finish_reason="length"),
               ScriptedReply(tool_calls=[tool_call("echo", {"text": "x"}, "c1")]),
               ScriptedReply(content="Done.")]
    with scripted_server(replies) as fake, \
            workbench_client(make_settings(tmp_path, fake.base_url, llm_max_tokens=64)) as client:
        events = post_turn(client, new_session(client)["id"], "Echo x", force_tool=True)
        assert events[-1]["content"] == "Done." and len(of_type(events, "retry")) == 1
        assert [e["name"] for e in of_type(events, "tool_result")] == ["echo"]


def test_a_forced_step_answered_without_a_tool_says_why(tmp_path):
    replies = [ScriptedReply(content="I know it already.")]  # a server that ignores tool_choice
    with scripted_server(replies) as fake, workbench_client(make_settings(tmp_path, fake.base_url)) as client:
        events = post_turn(client, new_session(client)["id"], "Echo x", force_tool=True)
        final = events[-1]
        assert final["outcome"] == "no_tool_call" and final["content"] == f"I know it already.\n\n{NO_TOOL_NOTE}"
        assert fake.bodies[0]["tool_choice"] == "required"


def test_an_unforced_answer_is_no_case_for_a_note(tmp_path):
    with scripted_server([ScriptedReply(content="Hello.")]) as fake, \
            workbench_client(make_settings(tmp_path, fake.base_url)) as client:
        events = post_turn(client, new_session(client)["id"], "Hi")
        assert events[-1]["content"] == "Hello." and events[-1]["outcome"] == "answered"


def test_invalid_arguments_are_answered_with_their_error_and_sent_back_as_an_object(tmp_path):
    replies = [ScriptedReply(tool_calls=[tool_call("echo", "{not json", "bad"), tool_call("echo", "[1]", "list")]),
               ScriptedReply(content="Sorry.")]
    with scripted_server(replies) as fake, workbench_client(make_settings(tmp_path, fake.base_url)) as client:
        events = post_turn(client, new_session(client)["id"], "Echo", force_tool=True)
        assert events[-1]["content"] == "Sorry."
        results = {e["tool_call_id"]: e for e in of_type(events, "tool_result")}
        assert "not valid JSON" in results["bad"]["error"] and "{not json" in results["bad"]["error"]
        assert "JSON object" in results["list"]["error"]
        assert [e["arguments"] for e in of_type(events, "tool_call")] == ["{not json", "[1]"], "shown as written"
        sent = fake.bodies[1]["messages"]
        assert [c["function"]["arguments"] for c in sent[-3]["tool_calls"]] == ["{}", "{}"]
        assert sent[-2]["content"].startswith("Error from tool echo: arguments are not valid JSON")
        _all_arguments_are_objects(fake.bodies)


# -- one step's results, fitted to the context that remains --------------------------------------

def _report(ctx, part: int) -> dict:
    """A long report: 60 rows of readings, one of them an anomaly (about 5,000 characters)."""
    rows = [{"row": i, "part": part, "status": "ok", "note": f"reading {i} of part {part} is nominal"}
            for i in range(60)]
    rows[17] = {"row": 17, "part": part, "status": "ERROR", "note": "pressure anomaly detected"}
    return {"part": part, "rows": rows}


REPORT = Tool("report", "A long report of one part.",
              object_schema({"part": {"type": "integer"}}, ["part"]), _report)
WIDE = Scenario(name="wide", title="Wide", description="Five long reports at once.", system_prompt=LAB.system_prompt,
                tools=(*LAB_TOOLS, REPORT, READ_ARTIFACT), starter_questions=(), summarize=lambda: {})


def test_five_long_results_of_one_step_are_fitted_to_the_context_and_kept_whole_as_artifacts(tmp_path):
    """Five results of 4,000 characters each (the per-result budget) are more than the context
    holds after the prompt: cut together to fit, the turn goes on, the full text is an artifact
    that read_artifact returns (the story writer's first step, issue 59)."""
    state: dict = {}

    def agent(body: dict) -> ScriptedReply:
        last = body["messages"][-1]
        if last["role"] == "user":
            return ScriptedReply(tool_calls=[tool_call("report", {"part": p}, f"r{p}") for p in range(5)])
        if "read_artifact" not in json.dumps(body["messages"]):
            state["seen"] = body["messages"]
            artifact = next(m["content"] for m in body["messages"] if m["role"] == "tool"
                            and "kept as artifact" in m["content"]).rsplit("kept as artifact ", 1)[1].rstrip("]")
            return ScriptedReply(tool_calls=[tool_call("read_artifact", {"artifact_id": artifact, "limit": 300}, "a1")])
        return ScriptedReply(content="Part 0 has a pressure anomaly in row 17.")

    settings = make_settings(tmp_path, "http://placeholder/v1", llm_max_tokens=400, tool_result_max_chars=4000,
                             tool_result_max_tokens=1000)
    fake = ScriptedOpenAI(agent, n_ctx=4000, count_tools=True)
    with fake, workbench_client(settings.model_copy(update={"llm_base_url": fake.base_url}),
                                ScenarioCatalog([WIDE])) as client:
        events = post_turn(client, new_session(client, "wide")["id"], "Check all five parts", force_tool=True)
        assert events[-1]["type"] == "final", events[-1]
        assert events[-1]["content"] == "Part 0 has a pressure anomaly in row 17."
        for body in fake.bodies:  # the fake refuses a request that does not fit (400): none did
            prompt = int(len(json.dumps(body["messages"]) + json.dumps(body["tools"])) / fake.chars_per_token)
            assert prompt + body["max_tokens"] <= fake.n_ctx
        second = fake.bodies[1]
        assert second["max_tokens"] == 400, "a full answer's room is left after the results"
        fitted = [e for e in of_type(events, "tool_result") if e.get("fitted")]
        assert {e["tool_call_id"] for e in fitted} == {f"r{p}" for p in range(5)}
        results = [m["content"] for m in state["seen"] if m["role"] == "tool"]
        assert all(len(r) < 1600 for r in results) and all("ERROR" in r for r in results), \
            "each cut to a summary that keeps the anomaly"
        with Session(client.app.state.workbench.engine) as db:
            artifacts = {a.id: a for a in db.exec(select(Artifact)).all()}
        assert {e["artifact_id"] for e in fitted} <= set(artifacts)
        assert all(json.loads(artifacts[e["artifact_id"]].content)["rows"][59]["row"] == 59 for e in fitted)
        page = next(e for e in of_type(events, "tool_result") if e["name"] == "read_artifact")
        assert page["error"] is None and '"offset":0' in page["content"]


def test_results_that_fit_are_left_as_they_are(tmp_path):
    calls = [tool_call("echo", {"text": "a"}, "c1"), tool_call("echo", {"text": "b"}, "c2")]
    replies = [ScriptedReply(tool_calls=calls), ScriptedReply(content="ok")]
    fake = ScriptedOpenAI(replies, n_ctx=4000)
    with fake, workbench_client(make_settings(tmp_path, fake.base_url)) as client:
        events = post_turn(client, new_session(client)["id"], "Echo twice", force_tool=True)
        assert not [e for e in of_type(events, "tool_result") if e.get("fitted")]
        assert [m["content"] for m in fake.bodies[1]["messages"] if m["role"] == "tool"] == \
            ['{"echo":"a"}', '{"echo":"b"}']


def test_water_cap_keeps_short_results_whole_and_cuts_the_long_ones_alike():
    assert water_cap([100, 5000, 5000], 10_200) == 5000  # all fit
    assert water_cap([100, 5000, 5000], 4100) == 2000  # 100 + 2000 + 2000
    assert water_cap([100, 5000, 5000], 10, floor=300) == 300  # never below the floor


def test_results_are_cut_again_when_the_server_refuses_what_the_estimate_let_through(tmp_path):
    """A server that counts no tokens for the workbench (no /tokenize) and, unlike the estimate
    learned from its usage, counts the tools' schemas out: the estimate lets the five results
    through, the server refuses the request as too long (400), and the results are cut again
    from their text against the tightened estimate: the turn goes on."""
    def agent(body: dict) -> ScriptedReply:
        if body["messages"][-1]["role"] == "user":
            return ScriptedReply(tool_calls=[tool_call("report", {"part": p}, f"r{p}") for p in range(5)])
        return ScriptedReply(content="Row 17 of each part has an anomaly.")

    settings = make_settings(tmp_path, "http://placeholder/v1", llm_max_tokens=400, tool_result_max_chars=4000,
                             tool_result_max_tokens=1000)
    fake = ScriptedOpenAI(agent, n_ctx=4000)
    with fake, workbench_client(settings.model_copy(update={"llm_base_url": fake.base_url}),
                                ScenarioCatalog([WIDE])) as client:
        session = new_session(client, "wide")
        events = post_turn(client, session["id"], "Check all five parts", force_tool=True)
        assert events[-1]["type"] == "final" and events[-1]["content"] == "Row 17 of each part has an anomaly."
        assert {e["tool_call_id"] for e in of_type(events, "tool_result") if e.get("fitted")} == \
            {f"r{p}" for p in range(5)}
        answered = fake.bodies[-1]
        assert int(len(json.dumps(answered["messages"])) / fake.chars_per_token) + answered["max_tokens"] <= 4000
        turn = client.get(f"/api/sessions/{session['id']}").json()["turns"][0]
        sent = [m["content"] for m in answered["messages"] if m["role"] == "tool"]
        assert [m["content"] for m in turn["messages"] if m["role"] == "tool"] == sent, "the state has what was sent"
        with Session(client.app.state.workbench.engine) as db:
            artifacts = {a.id for a in db.exec(select(Artifact)).all()}
        assert all(e["artifact_id"] in artifacts for e in of_type(events, "tool_result") if e.get("fitted"))


def test_a_step_whose_next_call_cannot_fit_even_cut_ends_the_turn_saying_what_ran(tmp_path):
    """The story writer's case (bench.story_run, 2026-12-06): a system prompt that takes most of a
    small context, and a step whose calls' own arguments are long. Cutting the results cannot make
    the next request fit: the turn ends with an answer saying what ran and why the model cannot
    go on (outcome context_full), not a failed turn, and the next turn goes on."""
    long_text = "word " * 3000  # 15,000 characters of arguments, which no fit may cut
    replies = [ScriptedReply(tool_calls=[tool_call("echo", {"text": long_text}, "c1")]),
               ScriptedReply(content="A new question, answered.")]
    fake = ScriptedOpenAI(replies, n_ctx=4000)
    with fake, workbench_client(make_settings(tmp_path, fake.base_url, llm_max_tokens=400)) as client:
        session = new_session(client)["id"]
        events = post_turn(client, session, "Echo this long text", force_tool=True)
        final = events[-1]
        assert final["type"] == "final" and final["outcome"] == "context_full", final
        assert final["content"].startswith("[Stopped after the tools ran (echo)") and "context holds 4000" in \
            final["content"]
        assert [e["name"] for e in of_type(events, "tool_result")][:1] == ["echo"]  # the tool did run
        # the fake refused the one request the workbench's estimate let through (400: it counts its own tokens)
        assert all(b["messages"][-1]["role"] == "tool" for b in fake.bodies[1:])
        again = post_turn(client, session, "Something short")
        assert again[-1]["type"] == "final" and again[-1]["content"] == "A new question, answered."
