"""Compacted tool schemas (app/agent/tool_schemas.py): stable bytes every turn, every property
name, type, required list and enum kept, noise dropped where the grammar does not change, and
arguments still checked against the full schema."""

from __future__ import annotations

import asyncio
import copy
import json

import pytest

from app.agent.requests import scenario_tools
from app.agent.tool_schemas import PARAMETER_DESCRIPTION_CHARS, compact_tool, compact_tools, schema_sizes
from app.settings import WorkbenchSettings
from scenarios.registry import list_scenarios
from tools.base import Tool, ToolContext, ToolError, object_schema, run_tool

PYDANTIC_STYLE = {  # what a LangChain tool's pydantic model gives
    "type": "function",
    "function": {
        "name": "lookup",
        "description": "Look   a thing\n   up.",
        "parameters": {
            "title": "LookupArgs", "type": "object", "$schema": "https://json-schema.org/draft/2020-12/schema",
            "properties": {
                "title": {"title": "Title", "type": "string", "description": "the  book's\ntitle"},
                "kind": {"title": "Kind", "type": "string", "enum": ["a", "b"], "default": "a"},
                "tags": {"title": "Tags", "type": "array", "items": {"title": "Tag", "type": "string"}},
                "where": {"anyOf": [{"$ref": "#/$defs/Place"}, {"type": "null"}]},
                "long": {"type": "string", "description": "word " * 200},
            },
            "required": ["title", "kind"],
            "additionalProperties": False,
            "$defs": {"Place": {"title": "Place", "type": "object", "properties": {"city": {"type": "string"}},
                                "additionalProperties": False}},
        },
    },
}


def _walk(node, path=""):
    """(path, key, value) of every schema keyword that carries meaning."""
    if isinstance(node, dict):
        for key, value in node.items():
            yield path, key, value
            yield from _walk(value, f"{path}/{key}")
    elif isinstance(node, list):
        for i, value in enumerate(node):
            yield from _walk(value, f"{path}/{i}")


def test_noise_is_dropped_and_meaning_kept():
    compact = compact_tool(PYDANTIC_STYLE)["function"]
    params = compact["parameters"]
    assert compact["description"] == "Look a thing up."
    assert list(params["properties"]) == ["title", "kind", "tags", "where", "long"], "a property named title stays"
    assert params["properties"]["title"] == {"type": "string", "description": "the book's title"}
    assert params["properties"]["kind"] == {"type": "string", "enum": ["a", "b"], "default": "a"}
    assert params["properties"]["tags"] == {"type": "array", "items": {"type": "string"}}
    assert params["properties"]["where"] == {"anyOf": [{"$ref": "#/$defs/Place"}, {"type": "null"}]}
    assert params["required"] == ["title", "kind"]
    assert "additionalProperties" not in params and "title" not in params and "$schema" not in params
    assert params["$defs"]["Place"] == {"type": "object", "properties": {"city": {"type": "string"}}}
    cut = params["properties"]["long"]["description"]
    assert len(cut) <= PARAMETER_DESCRIPTION_CHARS and cut.endswith("…")


def test_the_input_is_left_as_it_was():
    before = copy.deepcopy(PYDANTIC_STYLE)
    compact_tool(PYDANTIC_STYLE)
    assert PYDANTIC_STYLE == before


def test_additional_properties_stays_where_it_changes_meaning():
    bare = {"type": "function", "function": {"name": "f", "parameters": {"type": "object",
                                                                          "additionalProperties": False}}}
    assert compact_tool(bare) == bare, "without properties, dropping it would admit any object"
    strict = copy.deepcopy(PYDANTIC_STYLE)
    strict["function"]["strict"] = True
    params = compact_tool(strict)["function"]["parameters"]
    assert params["additionalProperties"] is False and params["$defs"]["Place"]["additionalProperties"] is False


@pytest.mark.parametrize("scenario", list_scenarios(), ids=lambda s: s.name)
def test_every_scenario_keeps_names_types_required_and_enums(scenario):
    full, compact = scenario_tools(scenario, compact=False), scenario_tools(scenario)
    assert [t["function"]["name"] for t in compact] == [t["function"]["name"] for t in full]
    for f, c in zip(full, compact):
        kept = {(p, k, json.dumps(v)) for p, k, v in _walk(c)}
        for path, key, value in _walk(f):
            if key in ("additionalProperties", "title") or isinstance(value, (dict, list)) and key != "enum" \
                    and key != "required":
                continue
            assert (path, key, json.dumps(value)) in kept, (f["function"]["name"], path, key)
    sizes = schema_sizes(full, compact, True)
    assert sizes["chars"] < sizes["full_chars"] and sizes["count"] == len(scenario.tools)


@pytest.mark.parametrize("scenario", list_scenarios(), ids=lambda s: s.name)
def test_compaction_is_stable_byte_for_byte(scenario):
    """The prompt prefix the server caches starts with the tools: every turn sends the same bytes."""
    texts = {json.dumps(scenario_tools(scenario)) for _ in range(3)}
    assert len(texts) == 1
    once = scenario_tools(scenario)
    assert compact_tools(once) == once, "compacting again changes nothing"


def test_arguments_are_still_checked_against_the_full_schema():
    tool = Tool("echo", "Echo.", object_schema({"text": {"type": "string", "enum": ["a", "b"]}}, ["text"]),
                lambda ctx, text: {"echo": text})
    sent = compact_tool(tool.openai_schema())["function"]["parameters"]
    assert "additionalProperties" not in sent  # the model's prompt no longer says it ...
    assert tool.parameters["additionalProperties"] is False  # ... the tool's own schema still does
    with pytest.raises(ToolError, match="extra"):
        asyncio.run(run_tool(tool, ToolContext(), {"text": "a", "extra": 1}))
    with pytest.raises(ToolError):
        asyncio.run(run_tool(tool, ToolContext(), {"text": "c"}))
    assert asyncio.run(run_tool(tool, ToolContext(), {"text": "a"})) == {"echo": "a"}


def test_the_setting_is_on_by_default_and_can_be_turned_off(monkeypatch):
    monkeypatch.delenv("ARBOR_COMPACT_TOOL_SCHEMAS", raising=False)
    assert WorkbenchSettings(_env_file=None).compact_tool_schemas is True
    monkeypatch.setenv("ARBOR_COMPACT_TOOL_SCHEMAS", "false")
    assert WorkbenchSettings(_env_file=None).compact_tool_schemas is False
    scenario = list_scenarios()[0]
    assert scenario_tools(scenario, compact=False) == [t.openai_schema() for t in scenario.tools]
