"""langchain-core messages <-> OpenAI Chat Completions message dicts, at the boundary.

The graph state holds langchain-core messages; request bodies, traces, manifests and the
turns stored in SQL hold OpenAI dicts. Both directions are exact for what the workbench
writes: an assistant message keeps its tool calls' ids, order and *arguments text* (the
model's own bytes, kept in ``additional_kwargs["tool_calls"]`` as ChatOpenAI does), so a
history sent again renders to the same tokens and the server's prefix cache still matches.
Arguments that are not a JSON object become ``invalid_tool_calls`` (with the readable error
the model is told) instead of failing the conversion, as langchain-core's own
``convert_to_messages`` would. Such a call is written back with ``{}`` as its arguments: a
history with arguments that are no JSON object is refused by servers that check it
(arbor-server: 400 "tool call arguments are not valid JSON"), and the call's tool answer
already tells the model what was wrong, quoting what it wrote.

Key order and fields follow what the workbench always sent: ``{"role", "content",
"tool_calls"}`` for the assistant (and ``"reasoning_content"`` when a thinking model gave one,
kept in ``additional_kwargs`` and sent back for the template to keep or drop),
``{"role", "tool_call_id", "content"}`` for a tool
result (no ``name``: ToolNode sets one, the OpenAI format does not have it).
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from typing import Any

from langchain_core.messages import AIMessage, BaseMessage, ToolMessage, convert_to_messages, convert_to_openai_messages
from langchain_core.messages.tool import invalid_tool_call, tool_call

from tools.base import ToolError

INVALID_ARGUMENTS = "{}"  # what a call whose arguments were no JSON object is sent back with


def parse_arguments(raw: Any) -> dict:
    """The model's arguments as a dict; ToolError when they are not a JSON object."""
    if isinstance(raw, dict):
        return raw
    try:
        value = json.loads(raw or "{}")
    except json.JSONDecodeError as exc:
        raise ToolError(f"arguments are not valid JSON ({exc.msg} at position {exc.pos}): {str(raw)[:200]}") from None
    if not isinstance(value, dict):
        raise ToolError(f"arguments must be a JSON object, got {type(value).__name__}")
    return value


def from_openai(messages: Iterable[dict]) -> list[BaseMessage]:
    """OpenAI message dicts as langchain-core messages (assistant tool calls and reasoning kept
    verbatim)."""
    out: list[BaseMessage] = []
    for m in messages:
        if m.get("role") == "assistant" and (m.get("tool_calls") or m.get("reasoning_content")):
            out.append(_assistant(m))
        else:
            out.append(convert_to_messages([m])[0])
    return out


def to_openai(messages: Iterable[BaseMessage]) -> list[dict]:
    """langchain-core messages as the OpenAI dicts the workbench sends and stores."""
    out = []
    for message in messages:
        if isinstance(message, AIMessage) and (message.tool_calls or message.invalid_tool_calls
                                               or message.additional_kwargs.get("reasoning_content")):
            entry: dict[str, Any] = {"role": "assistant", "content": _text(message)}
            if message.tool_calls or message.invalid_tool_calls:
                entry["tool_calls"] = openai_tool_calls(message)
            if message.additional_kwargs.get("reasoning_content"):
                entry["reasoning_content"] = message.additional_kwargs["reasoning_content"]
            out.append(entry)
        elif isinstance(message, ToolMessage):
            out.append({"role": "tool", "tool_call_id": message.tool_call_id, "content": _text(message)})
        else:
            out.append(convert_to_openai_messages(message))
    return out


def openai_tool_calls(message: AIMessage) -> list[dict]:
    """The message's tool calls (valid and invalid) as OpenAI entries, in the model's order.

    A call whose parsed arguments still equal its recorded raw text is sent as that text;
    one added or changed since (by a LangChain user, say) is written with ``json.dumps``.
    """
    valid = {c["id"]: c for c in message.tool_calls}
    invalid = {c["id"]: c for c in message.invalid_tool_calls}
    out, seen = [], set()
    for raw in message.additional_kwargs.get("tool_calls") or []:
        call_id, function = raw.get("id"), raw.get("function") or {}
        if call_id in valid and _same_arguments(function.get("arguments"), valid[call_id]["args"]) \
                and function.get("name") == valid[call_id]["name"]:
            out.append(raw)
            seen.add(call_id)
        elif call_id in invalid and function.get("arguments") == invalid[call_id]["args"]:
            out.append(_entry(call_id, function.get("name"), INVALID_ARGUMENTS))
            seen.add(call_id)
    for call in message.tool_calls:
        if call["id"] not in seen:
            out.append(_entry(call["id"], call["name"], json.dumps(call["args"])))
    for bad in message.invalid_tool_calls:
        if bad["id"] not in seen:
            out.append(_entry(bad["id"], bad["name"], INVALID_ARGUMENTS))
    return out


def _assistant(message: dict) -> AIMessage:
    valid, invalid = [], []
    for raw in message.get("tool_calls") or []:
        function = raw.get("function") or {}
        try:
            valid.append(tool_call(name=function.get("name", ""), args=parse_arguments(function.get("arguments")),
                                   id=raw.get("id")))
        except ToolError as exc:
            invalid.append(invalid_tool_call(name=function.get("name"), args=function.get("arguments"),
                                             id=raw.get("id"), error=str(exc)))
    extra: dict[str, Any] = {"tool_calls": list(message["tool_calls"])} if message.get("tool_calls") else {}
    if message.get("reasoning_content"):
        extra["reasoning_content"] = message["reasoning_content"]
    return AIMessage(content=message.get("content") or "", tool_calls=valid, invalid_tool_calls=invalid,
                     additional_kwargs=extra)


def _entry(call_id: str | None, name: str | None, arguments: str) -> dict:
    return {"id": call_id, "type": "function", "function": {"name": name, "arguments": arguments}}


def _same_arguments(raw: Any, args: dict) -> bool:
    try:
        return parse_arguments(raw) == args
    except ToolError:
        return False


def _text(message: BaseMessage) -> Any:
    if isinstance(message.content, str):
        return message.content
    return convert_to_openai_messages(message)["content"]
