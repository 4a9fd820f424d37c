"""The tool contract shared by scenarios/ and the workbench (app/).

A `Tool` pairs an OpenAI function schema with a Python function. The workbench calls
`run_tool`, which validates the model's arguments first (a readable `ToolError` if they do
not fit), then runs the function with a `ToolContext` (sync functions in a worker thread so
the event loop never blocks). Results are JSON-serialisable values the app puts into the
conversation. Exceptions other than `ToolError` propagate: the app records them as tool
errors in the trace.

`Tool.as_langchain_tool(ctx)` gives the same tool as a langchain-core `StructuredTool` (the
JSON schema as its `args_schema`, `run_tool` as its body), which LangGraph's `ToolNode` runs.
"""

from __future__ import annotations

import asyncio
import inspect
import json
from collections.abc import Callable
from dataclasses import dataclass
from functools import wraps
from typing import Any

from langchain_core.tools import StructuredTool

from tools.argument_validation import ArgumentProblems, check_schema, validate_arguments
from tools.workspace import Workspace


@dataclass(frozen=True)
class ToolContext:
    """What a tool may use besides its arguments. Built by the app from its settings."""

    incident_base_url: str = "http://127.0.0.1:8765"  # the simulated incident service
    http_timeout_s: float = 5.0
    workspace: Workspace | None = None  # the files of the turn's branch (tools/workspace.py); None: none
    artifact_reader: Callable[[str], str] | None = None  # artifact id -> full text (LookupError if unknown)
    result_budget_chars: int | None = None  # results longer than this enter the context trimmed


class ToolError(Exception):
    """A readable failure (bad arguments, unknown company/device, service down).

    The app records it in the trace and hands the message to the model as the tool result.
    """


class UnknownTool(ToolError):
    """The model named a tool the scenario does not have; the message lists the known ones."""


@dataclass(frozen=True)
class Tool:
    """A function the agent may call, described by a JSON Schema of its arguments.

    `func(ctx, **arguments)` returns a JSON-serialisable result; it may be sync or async.
    `requires_approval` marks a proposed action: the app never runs it on the model's say-so,
    it asks the operator; `func` then only formats the proposal record, unless
    `apply_on_approval`: then the app runs `func` once the operator approved (never before).
    """

    name: str
    description: str
    parameters: dict
    func: Callable[..., Any]
    requires_approval: bool = False
    apply_on_approval: bool = False

    def __post_init__(self) -> None:
        if self.apply_on_approval and not self.requires_approval:
            raise ValueError(f"tool {self.name}: apply_on_approval needs requires_approval")
        if self.parameters.get("type") != "object":
            raise ValueError(f"tool {self.name}: parameters must be a JSON Schema of type object")
        unknown_required = set(self.parameters.get("required", [])) - set(
            self.parameters.get("properties", {})
        )
        if unknown_required:
            raise ValueError(f"tool {self.name}: required names unknown properties {sorted(unknown_required)}")
        try:
            check_schema(self.parameters)
        except ValueError as exc:
            raise ValueError(f"tool {self.name}: parameters are {exc}") from None

    def openai_schema(self) -> dict:
        """The entry for the `tools` list of an OpenAI Chat Completions request."""
        return {
            "type": "function",
            "function": {
                "name": self.name,
                "description": self.description,
                "parameters": self.parameters,
            },
        }

    def as_langchain_tool(self, ctx: ToolContext) -> StructuredTool:
        """This tool as a langchain-core tool bound to `ctx`, for LangGraph's `ToolNode`.

        It validates and runs like `run_tool` (a `ToolError` propagates). Its response format
        is "content_and_artifact": the content is the result as JSON text, the artifact the
        result itself, so the caller can shape (trim) what enters the context.
        """
        async def call(**arguments: Any) -> tuple[str, Any]:
            result = await run_tool(self, ctx, arguments)
            return json.dumps(result, ensure_ascii=False, default=str), result

        return StructuredTool(name=self.name, description=self.description, args_schema=self.parameters,
                              coroutine=call, response_format="content_and_artifact")


async def run_tool(tool: Tool, ctx: ToolContext, arguments: dict) -> Any:
    """Validate `arguments` against `tool.parameters`, run `tool.func`, return its result.

    Invalid arguments (missing required keys, wrong types, values outside an enum, unknown
    keys) raise `ToolError` naming every problem. Sync functions run via `asyncio.to_thread`.
    """
    try:
        checked = validate_arguments(tool.parameters, arguments)
    except ArgumentProblems as problems:
        raise ToolError(f"invalid arguments for {tool.name}: {problems}") from None
    if inspect.iscoroutinefunction(tool.func):
        return await tool.func(ctx, **checked)
    result = await asyncio.to_thread(tool.func, ctx, **checked)
    if inspect.isawaitable(result):
        result = await result
    return result


def object_schema(properties: dict, required: tuple[str, ...] | list[str] = ()) -> dict:
    """Build a tool's `parameters` schema; unknown keys are rejected (`additionalProperties`)."""
    schema: dict = {"type": "object", "properties": properties}
    if required:  # an empty list is valid but costs prompt tokens on every request
        schema["required"] = list(required)
    schema["additionalProperties"] = False
    return schema


def with_data(source: Callable[[], Any]) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
    """A decorator factory for tools over a scenario's data: it turns ``f(data, ctx, **arguments)``
    into the Tool contract's ``f(ctx, **arguments)``, with ``data = source()`` at each call (the
    source caches). The scenario passes its loader in, so tools/ never imports scenarios/."""
    def bind(func: Callable[..., Any]) -> Callable[..., Any]:
        @wraps(func)
        def call(ctx: ToolContext, **arguments: Any) -> Any:
            return func(source(), ctx, **arguments)
        return call
    return bind
