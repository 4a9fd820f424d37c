"""A Messages request as the chat request chat completions serve (server.api.engine_bridge.chat_request).

- `system` (a string or text blocks) is the first message, role `system`.
- Consecutive messages of one role are one turn (as Anthropic combines them).
- A user turn's `tool_result` blocks become `tool` messages answering the calls of the assistant
  turn just before it (a result whose `tool_use_id` is not among them is a 400), placed before
  the turn's text, which follows as a `user` message; `is_error` prefixes the result with
  "Error: " (chat templates have no error flag).
- An assistant turn's text blocks are its content, its `thinking` blocks its
  `reasoning_content` (the template decides what to keep), its `tool_use` blocks its
  `tool_calls` (same ids); `redacted_thinking` is dropped (nothing readable to render). A final
  assistant turn is continued (prefill), as Anthropic does.
- Text blocks of a user turn, of `system` and of a tool result are joined with a newline; an
  assistant's are joined as they are (a prefill continues the exact text).
- `tools` are function tools with `input_schema` as parameters; `tool_choice` auto / any / tool /
  none are auto / required / the named function / none, and `disable_parallel_tool_use` is
  `parallel_tool_calls: false` (Anthropic allows parallel calls by default, so it is true
  otherwise).
- `thinking`: `enabled` sets the reasoning budget (`reasoning_budget_tokens`, which applies to a
  template with thinking tags and is accepted otherwise), `disabled` turns the template's
  thinking off (`reasoning_effort: none`), `adaptive` or none leaves the server's default.
- `output_config.format` (a JSON schema) is `response_format` json_schema: the reply is
  constrained to it; `output_config.effort` is accepted and has no effect.
- Sampling: `temperature`, `top_p`, `top_k` when given; the server's defaults otherwise (as for
  chat completions). `stop_sequences` are stop strings, limited by --max-stop and
  --max-stop-chars like a chat request's `stop`.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from pydantic import ValidationError

from server.api.engine_bridge.chat_request import ChatCompletionRequest
from server.api.http.errors import invalid
from server.api.protocols.anthropic_messages.request import (
    MessageParam,
    MessagesRequest,
    PromptFields,
    TextBlock,
    ThinkingAdaptive,
    ThinkingBlock,
    ThinkingDisabled,
    ThinkingEnabled,
    ToolChoiceAny,
    ToolChoiceAuto,
    ToolChoiceNone,
    ToolChoiceTool,
    ToolResultBlock,
    ToolUseBlock,
)
from server.settings import ServerSettings


@dataclass(frozen=True)
class Located:
    """A content block and where the client put it (for error messages)."""

    message: int
    block: int
    value: Any


@dataclass(frozen=True)
class Turn:
    """Consecutive messages of one role, as one turn."""

    role: str
    blocks: list[Located]


def turns(messages: list[MessageParam]) -> list[Turn]:
    out: list[Turn] = []
    for i, m in enumerate(messages):
        blocks = ([Located(i, 0, TextBlock(type="text", text=m.content))] if isinstance(m.content, str)
                  else [Located(i, j, b) for j, b in enumerate(m.content)])
        if out and out[-1].role == m.role:
            out[-1].blocks.extend(blocks)
        else:
            out.append(Turn(m.role, blocks))
    return out


def _assistant(turn: Turn) -> dict[str, Any]:
    text = "".join(b.value.text for b in turn.blocks if isinstance(b.value, TextBlock))
    reasoning = "".join(b.value.thinking for b in turn.blocks if isinstance(b.value, ThinkingBlock))
    calls = [{"id": b.value.id, "type": "function", "function": {"name": b.value.name, "arguments": b.value.input}}
             for b in turn.blocks if isinstance(b.value, ToolUseBlock)]
    msg: dict[str, Any] = {"role": "assistant", "content": text if text or not calls else None}
    if reasoning:
        msg["reasoning_content"] = reasoning
    if calls:
        msg["tool_calls"] = calls
    return msg


def _user(turn: Turn, open_calls: set[str]) -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = []
    texts: list[str] = []
    for b in turn.blocks:
        if isinstance(b.value, ToolResultBlock):
            if b.value.tool_use_id not in open_calls:
                where = f"messages.{b.message}.content.{b.block}"
                raise invalid(f"{where}: tool_result block with tool_use_id '{b.value.tool_use_id}' has no "
                              "corresponding tool_use block in the previous (assistant) message", param=where)
            out.append({"role": "tool", "tool_call_id": b.value.tool_use_id, "content": b.value.text()})
        elif isinstance(b.value, TextBlock):
            texts.append(b.value.text)
    if texts or not out:
        out.append({"role": "user", "content": "\n".join(texts)})
    return out


def chat_messages(body: PromptFields, messages: list[MessageParam] | None = None) -> list[dict[str, Any]]:
    """The chat messages of `body` (or of `body`'s system with other `messages`); 400 on a
    tool_result that answers no call of the turn before it."""
    out: list[dict[str, Any]] = []
    if isinstance(body.system, str) and body.system:
        out.append({"role": "system", "content": body.system})
    elif isinstance(body.system, list) and body.system:
        out.append({"role": "system", "content": "\n".join(b.text for b in body.system)})
    open_calls: set[str] = set()
    for turn in turns(body.messages if messages is None else messages):
        if turn.role == "assistant":
            out.append(_assistant(turn))
            open_calls = {b.value.id for b in turn.blocks if isinstance(b.value, ToolUseBlock)}
        else:
            out.extend(_user(turn, open_calls))
            open_calls = set()
    return out


def _tools(body: PromptFields) -> dict[str, Any]:
    if not body.tools:
        return {}
    fields: dict[str, Any] = {"tools": [
        {"type": "function", "function": {"name": t.name, "parameters": t.input_schema,
                                          **({"description": t.description} if t.description else {})}}
        for t in body.tools]}
    choice = body.tool_choice
    if isinstance(choice, ToolChoiceAuto):
        fields["tool_choice"] = "auto"
    elif isinstance(choice, ToolChoiceAny):
        fields["tool_choice"] = "required"
    elif isinstance(choice, ToolChoiceTool):
        fields["tool_choice"] = {"type": "function", "function": {"name": choice.name}}
    elif isinstance(choice, ToolChoiceNone):
        fields["tool_choice"] = "none"
    disabled = not isinstance(choice, ToolChoiceNone) and choice is not None and choice.disable_parallel_tool_use
    fields["parallel_tool_calls"] = not disabled
    return fields


def _thinking(body: PromptFields) -> dict[str, Any]:
    thinking = body.thinking
    if isinstance(thinking, ThinkingEnabled):
        return {"reasoning_budget_tokens": thinking.budget_tokens}
    if isinstance(thinking, ThinkingDisabled):
        return {"reasoning_effort": "none"}
    assert thinking is None or isinstance(thinking, ThinkingAdaptive)
    return {}


def _check_stops(stops: list[str], settings: ServerSettings) -> None:
    """The request guard's limits on `stop`, for the field's Anthropic name."""
    if len(stops) > settings.max_stop:
        raise invalid(f"stop_sequences: {len(stops)} given; this server accepts at most {settings.max_stop} "
                      "(--max-stop)", param="stop_sequences", code="too_many_stop")
    for s in stops:
        if len(s) > settings.max_stop_chars:
            raise invalid(f"stop_sequences: a stop sequence of {len(s)} characters; this server accepts at most "
                          f"{settings.max_stop_chars} (--max-stop-chars)", param="stop_sequences",
                          code="stop_too_long")


def _check_schema(schema: dict[str, Any], settings: ServerSettings) -> None:
    """The request guard's --max-schema-kib, for the field's Anthropic name."""
    size = len(json.dumps(schema, ensure_ascii=False, separators=(",", ":")).encode("utf-8"))
    if size > settings.max_schema_kib * 1024:
        raise invalid(f"output_config.format.schema: a JSON schema of {size} bytes; this server accepts at most "
                      f"{settings.max_schema_kib * 1024} (--max-schema-kib)", param="output_config.format.schema",
                      code="schema_too_large")


def _validated(fields: dict[str, Any]) -> ChatCompletionRequest:
    try:
        return ChatCompletionRequest.model_validate(fields)
    except ValidationError as exc:  # what the Messages schema let through but a chat request refuses
        first = exc.errors()[0]
        raise invalid(str(first.get("msg", "invalid request")).removeprefix("Value error, ")) from None


def chat_request(body: PromptFields, settings: ServerSettings) -> ChatCompletionRequest:
    """The chat request that generates `body`'s reply (a count of tokens: that renders its prompt)."""
    fields: dict[str, Any] = {"model": body.model, "messages": chat_messages(body), **_tools(body), **_thinking(body)}
    if isinstance(body, MessagesRequest):
        fields["max_tokens"] = body.max_tokens
        if body.stop_sequences:
            _check_stops(body.stop_sequences, settings)
            fields["stop"] = body.stop_sequences
        for name in ("temperature", "top_p", "top_k"):
            value = getattr(body, name)
            if value is not None:
                fields[name] = value
        if body.cache is not None:
            fields["cache"] = body.cache
        if body.cache_salt is not None:
            fields["cache_salt"] = body.cache_salt
        fmt = body.output_config.format if body.output_config is not None else None
        if fmt is not None:
            _check_schema(fmt.schema_, settings)
            fields["response_format"] = {"type": "json_schema",
                                         "json_schema": {"name": "output", "schema": fmt.schema_}}
    return _validated(fields)


def prefix_request(body: PromptFields, messages: list[MessageParam]) -> ChatCompletionRequest | None:
    """The chat request of `body`'s tools and system with only `messages`, rendered as a finished
    conversation (no generation prompt): its prompt is the prefix those messages end. None when
    there is nothing to render (no system and no messages)."""
    rendered = chat_messages(body, messages)
    if not rendered:
        return None
    fields: dict[str, Any] = {"model": body.model, "messages": rendered, **_tools(body), **_thinking(body),
                              "add_generation_prompt": False, "continue_final_message": False}
    fields.pop("tool_choice", None)  # tools render whatever the choice; a forced choice only adds a grammar
    return _validated(fields)
