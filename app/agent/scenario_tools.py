"""A scenario's tools, of either kind: the project's `Tool` (tools/base.py) or any
langchain-core `BaseTool` (a `@tool` function, a toolkit's tool).

Only a `Tool` can be a proposed action (`requires_approval`): the approval contract is the
project's. A plain LangChain tool is described by its own schema and validated by itself.
"""

from __future__ import annotations

from typing import Any

from langchain_core.tools import BaseTool
from langchain_core.utils.function_calling import convert_to_openai_tool
from pydantic import ValidationError

from tools.base import Tool, ToolContext, ToolError, run_tool

AnyTool = Tool | BaseTool


def openai_schema(tool: AnyTool) -> dict:
    """The tool's entry in a request's `tools` list."""
    return tool.openai_schema() if isinstance(tool, Tool) else convert_to_openai_tool(tool)


def parameters(tool: AnyTool) -> dict:
    """The JSON Schema of the tool's arguments."""
    return openai_schema(tool)["function"]["parameters"]


def requires_approval(tool: AnyTool) -> bool:
    return isinstance(tool, Tool) and tool.requires_approval


def langchain_tool(tool: AnyTool, ctx: ToolContext) -> BaseTool:
    """The tool as ToolNode runs it: a `Tool` bound to the turn's `ctx`, a `BaseTool` as it is."""
    return tool.as_langchain_tool(ctx) if isinstance(tool, Tool) else tool


async def run_outside_turn(tool: AnyTool, ctx: ToolContext, arguments: dict) -> Any:
    """Run a tool once, outside any turn (the scenario page's tool check): a `Tool` through
    `run_tool`, a `BaseTool` through its own validation. Bad arguments raise `ToolError`."""
    if isinstance(tool, Tool):
        return await run_tool(tool, ctx, arguments)
    try:
        return await tool.ainvoke(arguments)
    except ValidationError as exc:
        raise ToolError(f"invalid arguments for {tool.name}: {exc}") from None
