"""run_tool: argument validation with readable messages, sync and async tool functions."""

import asyncio
import threading

import pytest

from tools.base import Tool, ToolContext, ToolError, object_schema, run_tool

CTX = ToolContext()


def _echo(ctx, name, count=1, mode="short", tags=None, ratio=None):
    return {"name": name, "count": count, "mode": mode, "tags": tags, "ratio": ratio,
            "thread": threading.get_ident()}


ECHO = Tool(
    "echo", "Echo the arguments.",
    object_schema({
        "name": {"type": "string", "maxLength": 10},
        "count": {"type": "integer", "minimum": 1, "maximum": 5},
        "mode": {"type": "string", "enum": ["short", "long"]},
        "tags": {"type": "array", "items": {"type": "string"}},
        "ratio": {"type": "number"},
    }, ["name"]),
    _echo,
)


async def test_valid_arguments_reach_a_sync_function_in_a_worker_thread():
    result = await run_tool(ECHO, CTX, {"name": "pump", "count": 3, "tags": ["a"], "ratio": 0.5})
    assert result["name"] == "pump" and result["count"] == 3 and result["tags"] == ["a"]
    assert result["thread"] != threading.get_ident()


async def test_async_function_is_awaited_with_the_context():
    async def probe(ctx, value):
        await asyncio.sleep(0)
        return {"url": ctx.incident_base_url, "value": value}

    tool = Tool("probe", "Probe.", object_schema({"value": {"type": "integer"}}, ["value"]), probe)
    ctx = ToolContext(incident_base_url="http://127.0.0.1:9999")
    assert await run_tool(tool, ctx, {"value": 7}) == {"url": "http://127.0.0.1:9999", "value": 7}


async def test_integral_float_counts_as_integer_and_is_passed_as_int():
    result = await run_tool(ECHO, CTX, {"name": "x", "count": 2.0})
    assert result["count"] == 2 and isinstance(result["count"], int)


@pytest.mark.parametrize("arguments, expected", [
    ({}, "'name' is required"),
    ({"name": "x", "colour": "red"}, "'colour' is not an accepted argument (accepted: name, count, mode, tags, ratio)"),
    ({"name": 5}, "'name' must be a string, got the number 5"),
    ({"name": "x", "count": True}, "'count' must be an integer, got true"),
    ({"name": "x", "count": 2.5}, "'count' must be an integer, got the number 2.5"),
    ({"name": "x", "count": 9}, "'count' must be at most 5 (got 9)"),
    ({"name": "x", "mode": "medium"}, "'mode' must be one of short, long (got 'medium')"),
    ({"name": "x", "tags": ["a", 1]}, "'tags[1]' must be a string, got the number 1"),
    ({"name": "x" * 11}, "'name' must have at most 10 characters"),
    ({"name": "x", "ratio": "0.5"}, "'ratio' must be a number, got the string '0.5'"),
])
async def test_invalid_arguments_give_a_readable_tool_error(arguments, expected):
    with pytest.raises(ToolError) as caught:
        await run_tool(ECHO, CTX, arguments)
    message = str(caught.value)
    assert message.startswith("invalid arguments for echo: ")
    assert expected in message


async def test_every_problem_is_reported_at_once():
    with pytest.raises(ToolError) as caught:
        await run_tool(ECHO, CTX, {"count": 0, "extra": 1})
    message = str(caught.value)
    assert "'name' is required" in message
    assert "'extra' is not an accepted argument" in message
    assert "'count' must be at least 1 (got 0)" in message


async def test_non_object_arguments_are_rejected():
    with pytest.raises(ToolError, match="arguments must be a JSON object, got the string"):
        await run_tool(ECHO, CTX, '{"name": "x"}')


async def test_other_exceptions_propagate_unchanged():
    def broken(ctx):
        raise RuntimeError("disk on fire")

    tool = Tool("broken", "Breaks.", object_schema({}), broken)
    with pytest.raises(RuntimeError, match="disk on fire"):
        await run_tool(tool, CTX, {})


def test_openai_schema_shape():
    schema = ECHO.openai_schema()
    assert schema["type"] == "function"
    assert schema["function"]["name"] == "echo"
    assert schema["function"]["description"] == "Echo the arguments."
    assert schema["function"]["parameters"]["required"] == ["name"]
    assert schema["function"]["parameters"]["additionalProperties"] is False


def test_tool_definition_errors_are_caught_early():
    with pytest.raises(ValueError, match="type object"):
        Tool("bad", "Bad.", {"type": "string"}, _echo)
    with pytest.raises(ValueError, match="unknown properties"):
        Tool("bad", "Bad.", object_schema({}, ["missing"]), _echo)


async def test_a_keyword_without_our_sentence_still_fails_readably():
    """jsonschema enforces every keyword; one we have no sentence for keeps the library's words."""
    tool = Tool("code", "Code.", object_schema({"code": {"type": "string", "pattern": "^[A-Z]{3}-[0-9]{2}$"}}),
                lambda ctx, code: code)
    with pytest.raises(ToolError) as caught:
        await run_tool(tool, CTX, {"code": "pump"})
    assert "'code': 'pump' does not match" in str(caught.value)
    assert await run_tool(tool, CTX, {"code": "PMP-02"}) == "PMP-02"


async def test_integral_floats_in_integer_lists_are_passed_as_int():
    tool = Tool("ids", "Ids.", object_schema({"ids": {"type": "array", "items": {"type": "integer"}}}),
                lambda ctx, ids: ids)
    assert await run_tool(tool, CTX, {"ids": [1.0, 2]}) == [1, 2]


def test_a_schema_that_is_not_json_schema_is_refused_at_definition():
    with pytest.raises(ValueError, match="tool bad: parameters are not a valid JSON Schema"):
        Tool("bad", "Bad.", object_schema({"n": {"type": "integr"}}), _echo)
