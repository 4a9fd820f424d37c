"""From a Responses request (and the stored conversation it continues) to the chat request that
chat completions serve.

Items become chat messages: `instructions` a leading system message; a message item a message
of its role; the items of one answer (reasoning, assistant text, function calls) one assistant
message, its reasoning as `reasoning_content` and its calls as `tool_calls`; a
`function_call_output` a `tool` message answering the call whose `call_id` it names. A
continued response's messages are its chain's input and output items followed by the new
input, so its prompt extends the previous one and the prefix cache reuses that KV; the chain's
first response id is the cache session (unless the request gives `prompt_cache_key` or
`cache.session`). Instructions are not carried over from a previous response (OpenAI's rule):
each request sends its own.

Unlike chat completions, a conversation that ends with an assistant message is answered in a
new turn, not continued as a prefill (the Responses API has no prefill).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from pydantic import TypeAdapter, ValidationError

from server.api.engine_bridge.chat_request import ChatCompletionRequest
from server.api.http.errors import APIError, invalid
from server.api.http.response_store import StoredResponse
from server.api.protocols.openai_responses.request import (
    FunctionCallItem,
    FunctionCallOutputItem,
    InputItem,
    MessageItem,
    ReasoningItem,
    ResponsesRequest,
    ToolChoiceFunction,
)

Item = MessageItem | FunctionCallItem | FunctionCallOutputItem | ReasoningItem

_ITEM = TypeAdapter(InputItem)


@dataclass(frozen=True)
class PlannedResponse:
    """A Responses request ready to run: the chat request, the new input items as they will be
    stored, and where the response sits in its conversation."""

    chat: ChatCompletionRequest
    input_items: list[dict[str, Any]]
    root_id: str  # the chain's first response (the response itself when it starts one)
    session: str | None  # the cache session the request runs under


def history_items(chain: list[StoredResponse]) -> list[Item]:
    """A stored conversation's items in order: each response's input, then its output."""
    out: list[Item] = []
    for stored in chain:
        for raw in [*stored.input_items, *stored.body.get("output", [])]:
            out.append(_ITEM.validate_python(raw))
    return out


class _Messages:
    """Chat messages built item by item; `param(i)` names the i-th item in errors."""

    def __init__(self, param):
        self.messages: list[dict[str, Any]] = []
        self.calls: set[str] = set()
        self._param = param
        self._reasoning: str | None = None  # waiting for the assistant turn it belongs to
        self._answer_open = False  # the last message is an answer the next answer items join

    def add(self, i: int, item: Item) -> None:
        if isinstance(item, ReasoningItem):
            self._reasoning = item.text() or self._reasoning
            return
        if isinstance(item, MessageItem) and item.role == "assistant":
            self._answer()["content"] += item.text()
        elif isinstance(item, FunctionCallItem):
            if item.status == "incomplete":  # cut off by max_output_tokens: never a call the model made
                return
            self._answer().setdefault("tool_calls", []).append(
                {"id": item.call_id, "type": "function", "function": {"name": item.name, "arguments": item.arguments}})
            self.calls.add(item.call_id)
        elif isinstance(item, FunctionCallOutputItem):
            if item.call_id not in self.calls:
                raise invalid(f"{self._param(i)}: function_call_output names call_id {item.call_id!r}, which no "
                              "function_call before it in the conversation has", param=f"{self._param(i)}.call_id",
                              code="unknown_call_id")
            self._close()
            self.messages.append({"role": "tool", "tool_call_id": item.call_id, "content": item.text()})
        else:
            assert isinstance(item, MessageItem)
            self._close()
            self.messages.append({"role": item.role, "content": item.text()})

    def _answer(self) -> dict[str, Any]:
        if not self._answer_open:
            self.messages.append({"role": "assistant", "content": ""})
            self._answer_open = True
        msg = self.messages[-1]
        if self._reasoning:
            msg["reasoning_content"] = msg.get("reasoning_content", "") + self._reasoning
            self._reasoning = None
        return msg

    def _close(self) -> None:
        self._answer_open = False
        self._reasoning = None  # reasoning with no answer after it has nothing to belong to


def _tool_choice(choice) -> Any:
    if isinstance(choice, ToolChoiceFunction):
        return {"type": "function", "function": {"name": choice.name}}
    return choice


def _response_format(body: ResponsesRequest) -> dict[str, Any] | None:
    fmt = body.text.format if body.text is not None else None
    if fmt is None or fmt.type == "text":
        return None
    if fmt.type == "json_object":
        return {"type": "json_object"}
    return {"type": "json_schema", "json_schema": {"name": fmt.name, "schema": fmt.schema_, "strict": fmt.strict}}


def plan_response(body: ResponsesRequest, response_id: str, chain: list[StoredResponse] | None,
                  max_messages: int) -> PlannedResponse:
    """The chat request for response `response_id` answering `body` and continuing `chain`
    (None: a new conversation); 400 on items that do not make a conversation (a
    function_call_output without its call) or one longer than --max-messages.

    Its cache session: `prompt_cache_key`, else the chain's first response id when the
    conversation is or will be continued (a stored response, or one that continues another),
    else none; an explicit `cache.session` wins over both (server.api.engine_bridge.prompting)."""
    history = history_items(chain) if chain else []
    new = body.items()
    if len(history) + len(new) > max_messages:
        raise invalid(f"input: the conversation has {len(history) + len(new)} items with the previous responses'; "
                      f"this server accepts at most {max_messages} (--max-messages)", param="input",
                      code="too_many_messages")
    built = _Messages(lambda i: f"input.{i - len(history)}" if i >= len(history) else "previous_response_id")
    if body.instructions:
        built.messages.append({"role": "system", "content": body.instructions})
    for i, item in enumerate([*history, *new]):
        built.add(i, item)
    root_id = chain[0].id if chain else response_id
    session = body.prompt_cache_key
    if session is None and (chain or body.store):
        session = root_id
    fields: dict[str, Any] = {
        "model": body.model,
        "messages": built.messages,
        "max_tokens": body.max_output_tokens,
        "tools": [{"type": "function", "function": t.model_dump(exclude={"type"}, exclude_none=True)}
                  for t in body.tools or []] or None,
        "tool_choice": _tool_choice(body.tool_choice),
        "parallel_tool_calls": body.parallel_tool_calls,
        "response_format": _response_format(body),
        "reasoning_effort": body.reasoning.effort if body.reasoning is not None else None,
        "continue_final_message": False,
        "stream": body.stream,
        "cache": body.cache,
        "prompt_cache_key": session,
        "cache_salt": body.cache_salt,
        "seed": body.seed,
        "chat_template_kwargs": body.chat_template_kwargs,
    }
    for name in ("temperature", "top_p", "top_k", "min_p"):
        if getattr(body, name) is not None:
            fields[name] = getattr(body, name)
    try:
        chat = ChatCompletionRequest.model_validate(fields)
    except ValidationError as exc:  # what the Responses checks let through: name the chat field
        first = exc.errors()[0]
        param = ".".join(str(p) for p in first.get("loc", ())) or None
        raise APIError(f"{param}: {first.get('msg')}" if param else str(first.get("msg")), param=param,
                       code="invalid_request") from None
    return PlannedResponse(chat, [item.model_dump(mode="json", by_alias=True, exclude_none=True) for item in new],
                           root_id, session)
