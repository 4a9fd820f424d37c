"""One request in the shapes of the three APIs a manifest line may name (harness/manifest.py).

- :func:`to_responses` / :func:`to_messages`: a Chat Completions body as the OpenAI Responses
  and the Anthropic Messages body that asks for the same prompt (same messages, tools, tool
  choice, output length, sampling); :func:`lines_as` a whole chat manifest so (``arbor replay
  convert``, ``arbor replay generate --api``): one workload sent through every API.
- :func:`to_chat`: a Responses or Messages body back as the chat body the server renders its
  prompt from, following arbor-server's own translations (server/api/protocols/openai_responses/translate.py,
  server/api/protocols/anthropic_messages/translate.py); used to tokenize a line for the ideal and to render it
  as text. It reads what those translations read and ignores the rest (best effort for bodies
  it cannot follow, such as a ``previous_response_id`` whose stored chain only the server has).
- :func:`continues_with_tool_result`: whether a body's conversation ends with a tool's result
  (the turn goes on), for the replay's lifecycle hints.

The harness talks to servers only over HTTP (tests/test_import_direction.py), so these are
its own functions, not the server's; tests/harness/workloads/test_api_shapes.py checks them.
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from dataclasses import replace
from typing import Any

from harness.manifest import CHAT, ManifestLine

# Chat fields that mean the same in a Responses request, under the same name.
_RESPONSES_SAME = ("model", "temperature", "top_p", "top_k", "min_p", "seed", "parallel_tool_calls",
                   "prompt_cache_key", "stream", "chat_template_kwargs", "cache", "ignore_eos")
# ... and in a Messages request (``cache`` and ``ignore_eos`` are Arbor's/llama-server's own).
_MESSAGES_SAME = ("model", "temperature", "top_p", "top_k", "stream", "cache", "ignore_eos")


def _text(content: Any) -> str:
    """The text of a chat message's content (a string, or text parts)."""
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return "".join(str(p.get("text", "")) for p in content if isinstance(p, dict) and p.get("type") == "text")
    raise ValueError(f"message content must be a string or a list of parts, got {type(content).__name__}")


def _max_tokens(body: dict[str, Any]) -> int | None:
    for key in ("max_completion_tokens", "max_tokens"):
        if isinstance(body.get(key), int):
            return int(body[key])
    return None


# -- chat -> responses ---------------------------------------------------------------------

def _responses_tool(tool: dict[str, Any]) -> dict[str, Any]:
    function = tool.get("function") or {}
    out = {"type": "function", "name": function["name"]}
    for key in ("description", "parameters", "strict"):
        if key in function:
            out[key] = function[key]
    return out


def _responses_tool_choice(choice: Any) -> Any:
    if isinstance(choice, dict):
        return {"type": "function", "name": (choice.get("function") or {}).get("name")}
    return choice


def to_responses(chat: dict[str, Any], store: bool = False) -> dict[str, Any]:
    """The Responses body of a chat body: a leading system message as ``instructions``, every
    other message as input items (assistant reasoning as a reasoning item, tool calls as
    ``function_call`` items, tool messages as ``function_call_output``), flat function tools,
    ``max_output_tokens``, ``text.format`` from ``response_format``. ``store`` is false by
    default, as Codex sends it: the whole conversation goes with every request."""
    messages = list(chat.get("messages") or [])
    out: dict[str, Any] = {}
    if messages and messages[0].get("role") == "system":
        out["instructions"] = _text(messages[0].get("content"))
        messages = messages[1:]
    items: list[dict[str, Any]] = []
    for m in messages:
        role = m.get("role")
        if role == "tool":
            items.append({"type": "function_call_output", "call_id": m["tool_call_id"],
                          "output": _text(m.get("content"))})
        elif role == "assistant":
            if m.get("reasoning_content"):
                items.append({"type": "reasoning", "summary": [],
                              "content": [{"type": "reasoning_text", "text": m["reasoning_content"]}]})
            text = _text(m.get("content"))
            if text:
                items.append({"type": "message", "role": "assistant",
                              "content": [{"type": "output_text", "text": text}]})
            for call in m.get("tool_calls") or []:
                function = call.get("function") or {}
                arguments = function.get("arguments", "{}")
                items.append({"type": "function_call", "call_id": call["id"], "name": function["name"],
                              "arguments": arguments if isinstance(arguments, str) else json.dumps(arguments)})
        elif role in ("user", "system", "developer"):
            items.append({"type": "message", "role": role,
                          "content": [{"type": "input_text", "text": _text(m.get("content"))}]})
        else:
            raise ValueError(f"message role {role!r} has no Responses item")
    out["input"] = items
    if chat.get("tools"):
        out["tools"] = [_responses_tool(t) for t in chat["tools"]]
    if chat.get("tool_choice") is not None:
        out["tool_choice"] = _responses_tool_choice(chat["tool_choice"])
    for key in _RESPONSES_SAME:
        if key in chat:
            out[key] = chat[key]
    limit = _max_tokens(chat)
    if limit is not None:
        out["max_output_tokens"] = limit
    fmt = chat.get("response_format")
    if isinstance(fmt, dict) and fmt.get("type") == "json_schema":
        schema = fmt.get("json_schema") or {}
        out["text"] = {"format": {"type": "json_schema", "name": schema.get("name", "response"),
                                  "schema": schema.get("schema"), **({"strict": schema["strict"]}
                                                                     if "strict" in schema else {})}}
    elif isinstance(fmt, dict) and fmt.get("type") == "json_object":
        out["text"] = {"format": {"type": "json_object"}}
    if chat.get("reasoning_effort") is not None:
        out["reasoning"] = {"effort": chat["reasoning_effort"]}
    out["store"] = store
    return out


# -- chat -> messages ----------------------------------------------------------------------

def _arguments_object(arguments: Any) -> Any:
    if isinstance(arguments, str):
        try:
            return json.loads(arguments) if arguments.strip() else {}
        except json.JSONDecodeError:
            raise ValueError(f"tool call arguments are not JSON: {arguments[:80]!r}") from None
    return arguments


def _messages_tool_choice(choice: Any, parallel: Any) -> dict[str, Any] | None:
    if choice is None and parallel is not False:
        return None
    if isinstance(choice, dict):
        out: dict[str, Any] = {"type": "tool", "name": (choice.get("function") or {}).get("name")}
    else:
        out = {"type": {"auto": "auto", "required": "any", "none": "none", None: "auto"}[choice]}
    if parallel is False and out["type"] != "none":
        out["disable_parallel_tool_use"] = True
    return out


def to_messages(chat: dict[str, Any], default_max_tokens: int = 1024) -> dict[str, Any]:
    """The Messages body of a chat body: leading system messages as ``system``, then alternating
    user and assistant messages of content blocks (reasoning as ``thinking``, tool calls as
    ``tool_use`` with the arguments as an object, tool messages as ``tool_result`` blocks of the
    next user message, before its text, as arbor-server reads them back), tools with
    ``input_schema``, ``max_tokens`` (required by the API: ``default_max_tokens`` when the chat
    body has none). A system message after the first turn has no Messages form: ValueError."""
    messages = list(chat.get("messages") or [])
    systems: list[str] = []
    while messages and messages[0].get("role") in ("system", "developer"):
        systems.append(_text(messages.pop(0).get("content")))
    turns: list[dict[str, Any]] = []

    def add(role: str, blocks: list[dict[str, Any]]) -> None:
        if turns and turns[-1]["role"] == role:
            turns[-1]["content"].extend(blocks)
        else:
            turns.append({"role": role, "content": blocks})

    for m in messages:
        role = m.get("role")
        if role == "tool":
            add("user", [{"type": "tool_result", "tool_use_id": m["tool_call_id"], "content": _text(m.get("content"))}])
        elif role == "user":
            add("user", [{"type": "text", "text": _text(m.get("content"))}])
        elif role == "assistant":
            blocks: list[dict[str, Any]] = []
            if m.get("reasoning_content"):
                blocks.append({"type": "thinking", "thinking": m["reasoning_content"], "signature": ""})
            text = _text(m.get("content"))
            if text:
                blocks.append({"type": "text", "text": text})
            for call in m.get("tool_calls") or []:
                function = call.get("function") or {}
                blocks.append({"type": "tool_use", "id": call["id"], "name": function["name"],
                               "input": _arguments_object(function.get("arguments", "{}"))})
            add("assistant", blocks)
        else:
            raise ValueError(f"a {role!r} message after the conversation began has no Messages form")
    out: dict[str, Any] = {}
    if systems:
        out["system"] = "\n".join(systems)
    out["messages"] = turns
    if chat.get("tools"):
        out["tools"] = []
        for tool in chat["tools"]:
            function = tool.get("function") or {}
            entry = {"name": function["name"], "input_schema": function.get("parameters") or {"type": "object"}}
            if function.get("description"):
                entry["description"] = function["description"]
            out["tools"].append(entry)
        choice = _messages_tool_choice(chat.get("tool_choice"), chat.get("parallel_tool_calls"))
        if choice is not None:
            out["tool_choice"] = choice
    for key in _MESSAGES_SAME:
        if key in chat:
            out[key] = chat[key]
    out["max_tokens"] = _max_tokens(chat) or default_max_tokens
    if chat.get("stop"):
        out["stop_sequences"] = [chat["stop"]] if isinstance(chat["stop"], str) else list(chat["stop"])
    if chat.get("reasoning_effort") == "none":
        out["thinking"] = {"type": "disabled"}
    fmt = chat.get("response_format")
    if isinstance(fmt, dict) and fmt.get("type") == "json_schema":
        schema = (fmt.get("json_schema") or {}).get("schema")
        out["output_config"] = {"format": {"type": "json_schema", "schema": schema}}
    return out


# -- back to chat --------------------------------------------------------------------------

def _parts_text(content: Any) -> str:
    """Text of Responses content: a string or text parts (input_text, output_text, text, refusal)."""
    if isinstance(content, str):
        return content
    out = []
    for part in content or []:
        if isinstance(part, dict):
            out.append(str(part.get("refusal") if part.get("type") == "refusal" else part.get("text", "")))
    return "".join(out)


def responses_to_chat(body: dict[str, Any]) -> dict[str, Any]:
    """The chat body arbor-server renders a Responses body's prompt from (its stored chain aside):
    instructions first, then one message per item, an answer's reasoning, text and calls joined
    into one assistant message."""
    messages: list[dict[str, Any]] = []
    if body.get("instructions"):
        messages.append({"role": "system", "content": body["instructions"]})
    items = body.get("input")
    items = [{"type": "message", "role": "user", "content": items}] if isinstance(items, str) else list(items or [])
    answer: dict[str, Any] | None = None
    reasoning: str | None = None

    def open_answer() -> dict[str, Any]:
        nonlocal answer, reasoning
        if answer is None:
            answer = {"role": "assistant", "content": ""}
            messages.append(answer)
        if reasoning:
            answer["reasoning_content"] = answer.get("reasoning_content", "") + reasoning
            reasoning = None
        return answer

    for item in items:
        kind = item.get("type", "message")
        if kind == "reasoning":
            parts = item.get("content") or item.get("summary") or []
            reasoning = "".join(str(p.get("text", "")) for p in parts) or reasoning
        elif kind == "message" and item.get("role") == "assistant":
            open_answer()["content"] += _parts_text(item.get("content"))
        elif kind == "function_call":
            if item.get("status") == "incomplete":
                continue
            open_answer().setdefault("tool_calls", []).append(
                {"id": item["call_id"], "type": "function",
                 "function": {"name": item["name"], "arguments": item.get("arguments", "{}")}})
        else:
            answer, reasoning = None, None
            if kind == "function_call_output":
                messages.append({"role": "tool", "tool_call_id": item["call_id"],
                                 "content": _parts_text(item.get("output"))})
            else:
                messages.append({"role": item.get("role", "user"), "content": _parts_text(item.get("content"))})
    out: dict[str, Any] = {"messages": messages}
    if body.get("tools"):
        out["tools"] = [{"type": "function", "function": {k: v for k, v in t.items() if k != "type"}}
                        for t in body["tools"]]
    return out


def _block_text(content: Any) -> str:
    if isinstance(content, str):
        return content
    return "\n".join(str(b.get("text", "")) for b in content or [] if isinstance(b, dict) and b.get("type") == "text")


def messages_to_chat(body: dict[str, Any]) -> dict[str, Any]:
    """The chat body arbor-server renders a Messages body's prompt from: ``system`` first, one
    turn per run of one role, tool results as tool messages before the turn's text."""
    messages: list[dict[str, Any]] = []
    system = body.get("system")
    if system:
        messages.append({"role": "system", "content": _block_text(system)})
    turns: list[tuple[str, list[Any]]] = []
    for m in body.get("messages") or []:
        content = m.get("content")
        blocks = [{"type": "text", "text": content}] if isinstance(content, str) else list(content or [])
        if turns and turns[-1][0] == m.get("role"):
            turns[-1][1].extend(blocks)
        else:
            turns.append((m.get("role", "user"), blocks))
    for role, blocks in turns:
        if role == "assistant":
            text = "".join(str(b.get("text", "")) for b in blocks if b.get("type") == "text")
            thinking = "".join(str(b.get("thinking", "")) for b in blocks if b.get("type") == "thinking")
            calls = [{"id": b["id"], "type": "function",
                      "function": {"name": b["name"], "arguments": b.get("input", {})}}
                     for b in blocks if b.get("type") == "tool_use"]
            message: dict[str, Any] = {"role": "assistant", "content": text if text or not calls else None}
            if thinking:
                message["reasoning_content"] = thinking
            if calls:
                message["tool_calls"] = calls
            messages.append(message)
            continue
        texts: list[str] = []
        results = 0
        for b in blocks:
            if b.get("type") == "tool_result":
                results += 1
                content = _block_text(b.get("content", ""))
                messages.append({"role": "tool", "tool_call_id": b["tool_use_id"],
                                 "content": ("Error: " + content) if b.get("is_error") else content})
            elif b.get("type") == "text":
                texts.append(str(b.get("text", "")))
        if texts or not results:
            messages.append({"role": "user", "content": "\n".join(texts)})
    out: dict[str, Any] = {"messages": messages}
    if body.get("tools"):
        out["tools"] = [{"type": "function", "function": {"name": t["name"], "parameters": t.get("input_schema"),
                                                          **({"description": t["description"]}
                                                             if t.get("description") else {})}}
                        for t in body["tools"]]
    return out


def to_chat(api: str, body: dict[str, Any]) -> dict[str, Any]:
    """``body`` of ``api`` as the chat body its prompt is rendered from (a chat body as it is)."""
    if api == CHAT:
        return body
    if api == "responses":
        return responses_to_chat(body)
    if api == "messages":
        return messages_to_chat(body)
    raise ValueError(f"unknown api {api!r}")


def continues_with_tool_result(api: str, body: dict[str, Any]) -> bool:
    """Whether the body's conversation ends with a tool's result (the model's turn goes on)."""
    if api == "responses":
        items = body.get("input")
        return isinstance(items, list) and bool(items) and isinstance(items[-1], dict) \
            and items[-1].get("type") == "function_call_output"
    messages = body.get("messages") or []
    if not messages or not isinstance(messages[-1], dict):
        return False
    last = messages[-1]
    if api == "messages":
        content = last.get("content")
        return last.get("role") == "user" and isinstance(content, list) and bool(content) \
            and all(isinstance(b, dict) and b.get("type") == "tool_result" for b in content)
    return last.get("role") == "tool"


def line_as(line: ManifestLine, api: str) -> ManifestLine:
    """A chat line as the same request through ``api`` (a line already of ``api`` as it is).
    The output length the body asks for is the line's ``expected_output_tokens`` when it has no
    limit of its own (Messages requires one)."""
    if line.api == api:
        return line
    if line.api != CHAT:
        raise ValueError(f"only chat lines can be translated; this one is {line.api}")
    if api == "responses":
        body = to_responses(line.body)
    elif api == "messages":
        body = to_messages(line.body, default_max_tokens=line.expected_output_tokens or 1024)
    else:
        raise ValueError(f"unknown api {api!r}")
    return replace(line, body=body, api=api)


def lines_as(lines: Iterable[ManifestLine], api: str) -> list[ManifestLine]:
    """Every line of a chat manifest as the same request through ``api`` (see :func:`line_as`)."""
    return [line_as(line, api) for line in lines]


def returned_tools(api: str, body: dict[str, Any]) -> str | None:
    """The tools whose results the body's conversation ends with, as one name (the distinct names sorted,
    joined by `+`: calls that ran together, one wait); None when it does not end with a tool's result."""
    if not continues_with_tool_result(api, body):
        return None
    names: dict[str, str] = {}  # call id -> tool name, from the assistant's calls
    returned: list[str] = []  # call ids the trailing results answer
    if api == "responses":
        items = [i for i in body["input"] if isinstance(i, dict)]
        for item in items:
            if item.get("type") == "function_call":
                names[str(item.get("call_id"))] = str(item.get("name"))
        for item in reversed(items):
            if item.get("type") != "function_call_output":
                break
            returned.append(str(item.get("call_id")))
    elif api == "messages":
        for message in (m for m in body["messages"] if isinstance(m, dict) and m.get("role") == "assistant"):
            content = message.get("content")
            for block in content if isinstance(content, list) else ():
                if isinstance(block, dict) and block.get("type") == "tool_use":
                    names[str(block.get("id"))] = str(block.get("name"))
        returned = [str(b.get("tool_use_id")) for b in body["messages"][-1]["content"]]
    else:
        messages = [m for m in body["messages"] if isinstance(m, dict)]
        for message in messages:
            for call in message.get("tool_calls") or () if message.get("role") == "assistant" else ():
                if isinstance(call, dict):
                    names[str(call.get("id"))] = str((call.get("function") or {}).get("name"))
        for message in reversed(messages):
            if message.get("role") != "tool":
                break
            returned.append(str(message.get("tool_call_id")))
    found = sorted({names[c] for c in returned if c in names})
    return "+".join(found) if found else None
