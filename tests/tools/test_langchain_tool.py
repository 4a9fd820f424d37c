"""Tool.as_langchain_tool: the project's tool as a langchain-core StructuredTool."""

import pytest
from langchain_core.messages import ToolMessage
from langchain_core.utils.function_calling import convert_to_openai_tool

from tools.base import Tool, ToolContext, ToolError, object_schema

CTX = ToolContext(http_timeout_s=1.5)


def _rows(ctx, device: str, limit: int = 2) -> list[dict]:
    return [{"device": device, "i": i, "timeout": ctx.http_timeout_s} for i in range(limit)]


ROWS = Tool("rows", "Rows of a device.", object_schema({"device": {"type": "string"}, "limit": {"type": "integer"}},
                                                       ["device"]), _rows)


def test_schema_is_the_tools_own_json_schema():
    assert convert_to_openai_tool(ROWS.as_langchain_tool(CTX)) == ROWS.openai_schema()


async def test_a_tool_call_gives_json_content_and_the_raw_result_as_artifact():
    message = await ROWS.as_langchain_tool(CTX).ainvoke(
        {"type": "tool_call", "id": "c1", "name": "rows", "args": {"device": "pump-7", "limit": 1}})
    assert isinstance(message, ToolMessage) and message.tool_call_id == "c1"
    assert message.artifact == [{"device": "pump-7", "i": 0, "timeout": 1.5}]  # bound to the context
    assert message.content == '[{"device": "pump-7", "i": 0, "timeout": 1.5}]'


async def test_arguments_are_validated_by_the_tools_schema():
    with pytest.raises(ToolError, match="invalid arguments for rows"):
        await ROWS.as_langchain_tool(CTX).ainvoke({"device": "pump-7", "extra": 1})
