"""Pure parts of the agent: routers, tool_choice policy, trimming."""

import json

from langchain_core.messages import AIMessage
from langgraph.graph import END

from app.agent.routers import route_after_model, tool_choice_for_step
from app.agent.trimming import trim_tool_result


def _state(last, steps=1, max_steps=4, awaiting=(), decisions=None):
    return {"messages": [last], "steps": steps, "max_steps": max_steps, "awaiting": list(awaiting),
            "decisions": decisions or {}}


CALL = AIMessage("", tool_calls=[{"name": "echo", "args": {}, "id": "c1"}])
UNPARSABLE = AIMessage("", invalid_tool_calls=[{"name": "echo", "args": "{bad", "id": "c2", "error": "not JSON"}])


def test_route_after_model():
    assert route_after_model(_state(AIMessage("hi"))) == END
    assert route_after_model(_state(CALL)) == "tools"
    assert route_after_model(_state(UNPARSABLE)) == "tools"  # its error is the answer the model gets
    assert route_after_model(_state(CALL, steps=4)) == "budget_exhausted"
    assert route_after_model(_state(CALL, awaiting=["c1"])) == "approval"
    assert route_after_model(_state(CALL, awaiting=["c1"], decisions={"c1": {"approved": True}})) == "tools"


def test_tool_choice_policy():
    assert tool_choice_for_step(1, 4, False, None) is None
    assert tool_choice_for_step(1, 4, True, None) == "required"
    assert tool_choice_for_step(2, 4, True, None) is None
    named = {"type": "function", "function": {"name": "x"}}
    assert tool_choice_for_step(1, 4, True, named) == named
    assert tool_choice_for_step(4, 4, False, None) == "none"
    assert tool_choice_for_step(1, 1, True, None) == "required"  # forcing wins on a one-step budget


def test_small_results_pass_unchanged():
    shaped = trim_tool_result({"a": [1, 2, 3]}, 100, "art")
    assert not shaped.trimmed and shaped.context_text == '{"a":[1,2,3]}' == shaped.full_text
    assert trim_tool_result("plain text", 100, "art").context_text == "plain text"


def test_trimming_keeps_shape_evidence_and_a_reference():
    rows = [{"t": i, "value": 20.0, "msg": "ok    reading"} for i in range(500)]
    rows[321] = {"t": 321, "value": 99.9, "msg": "ANOMALY: spike"}
    rows += rows[:50]  # duplicates
    shaped = trim_tool_result({"device": "pump-7", "rows": rows}, 800, "art123")
    assert shaped.trimmed and len(shaped.context_text) <= 800
    assert json.loads(shaped.full_text)["rows"] == rows  # the full result is untouched
    body, note = shaped.context_text.rsplit("\n", 1)
    compact = json.loads(body)
    assert compact["device"] == "pump-7"
    assert {"t": 321, "value": 99.9, "msg": "ANOMALY: spike"} in compact["rows"]
    assert "more items omitted" in compact["rows"][-1] and "50 duplicates removed" in compact["rows"][-1]
    assert "art123" in note and str(len(shaped.full_text)) in note


def test_trimming_a_huge_scalar_is_cut_to_budget():
    shaped = trim_tool_result("x" * 10_000, 300, "a1")
    assert shaped.trimmed and len(shaped.context_text) <= 300 and "a1" in shaped.context_text
