"""The scenario registry: names, prompts, tools, data summaries, errors."""

import json

import pytest

from scenarios.registry import Scenario, UnknownScenario, get_scenario, list_scenarios
from tools.base import Tool, ToolError

NAMES = ["financial_research", "field_maintenance", "edge_incident", "story_writer"]
# story_writer is the long-context scenario on purpose (seed 002): its prompt carries the whole
# manuscript and a generated reference library whose size is a setting (tests/scenarios/
# test_story_corpus.py checks what the default costs in tokens), and it has fifteen tools.
PROMPT_LIMIT = {"story_writer": 6000}
SCHEMA_LIMIT = {"story_writer": 5000}


def test_four_scenarios_in_fixed_order():
    assert [s.name for s in list_scenarios()] == NAMES
    for name in NAMES:
        assert get_scenario(name).name == name


@pytest.mark.parametrize("name", NAMES)
def test_scenario_is_complete_and_compact(name):
    scenario = get_scenario(name)
    assert isinstance(scenario, Scenario)
    assert scenario.title and scenario.description and scenario.starter_questions
    # A 135M model with an 8K context runs these prompts on 2 cores: keep them short.
    assert 100 < len(scenario.system_prompt) < PROMPT_LIMIT.get(name, 600)
    assert scenario.tools and all(isinstance(t, Tool) for t in scenario.tools)
    for tool in scenario.tools:
        schema = tool.openai_schema()
        assert schema["function"]["parameters"]["type"] == "object"
        assert len(tool.description) <= 90
    tool_schemas = json.dumps([t.openai_schema() for t in scenario.tools])
    assert len(tool_schemas) < SCHEMA_LIMIT.get(name, 3000)
    json.dumps(scenario.data_summary())  # serialisable for the home page


def test_prompt_names_the_companies_in_the_data():
    scenario = get_scenario("financial_research")
    for company in scenario.data_summary()["companies"]:
        assert company["ticker"] in scenario.system_prompt
        assert company["name"] in scenario.system_prompt


def test_only_proposed_actions_require_approval():
    needing = [(s.name, t.name) for s in list_scenarios() for t in s.tools if t.requires_approval]
    assert needing == [("edge_incident", "propose_action"), ("story_writer", "append_chapter")]


def test_data_summaries_describe_local_data():
    financial = get_scenario("financial_research").data_summary()
    assert len(financial["companies"]) >= 3 and len(financial["quarters"]) == 8
    fleet = get_scenario("field_maintenance").data_summary()
    assert {d["id"] for d in fleet["devices"]} >= {"PUMP-02", "COMP-01", "TX-01"}
    incident = get_scenario("edge_incident").data_summary()
    assert incident["states"] == ["healthy", "degraded", "failed"]


def test_unknown_scenario_lists_the_known_names():
    with pytest.raises(UnknownScenario) as caught:
        get_scenario("chess")
    assert isinstance(caught.value, LookupError)
    assert str(caught.value) == ("unknown scenario 'chess'; known: financial_research, "
                                 "field_maintenance, edge_incident, story_writer")


def test_unknown_tool_is_a_tool_error_listing_the_known_tools():
    scenario = get_scenario("field_maintenance")
    assert scenario.tool("query_logs").name == "query_logs"
    with pytest.raises(ToolError) as caught:
        scenario.tool("get_report")
    assert "unknown tool 'get_report' in scenario field_maintenance; known: device_status" in str(caught.value)


def test_duplicate_tool_names_are_refused():
    tool = get_scenario("edge_incident").tool("service_status")
    with pytest.raises(ValueError, match="duplicate tool names"):
        Scenario("x", "X", "x", "prompt", (tool, tool), ("q",))
