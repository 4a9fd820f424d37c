"""Responses output: the output items of a reply and the Response object that carries them.

Items as OpenAI writes them: a `reasoning` item (the chat layer's reasoning_content, as one
`reasoning_text` part), a `message` item (the content, one `output_text` part), one
`function_call` item per call (its `call_id` is the id the reply parser gave the call, which a
later `function_call_output` names). A reply that stopped at max_output_tokens makes the
response `incomplete` with `incomplete_details.reason` "max_output_tokens", as OpenAI's does.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from server.api.engine_bridge.chat_layer import ParsedReply
from server.api.engine_bridge.chat_request import ChatCompletionRequest
from server.api.engine_bridge.generation import Collected
from server.api.engine_bridge.reply_stream import ReplyStream, ToolCall
from server.api.protocols.finish_report import arbor_extension, timings
from server.api.protocols.openai_body import ServedModel
from server.api.protocols.openai_responses.request import ResponsesRequest, ToolChoiceFunction
from server.engine.sequence import Finished

TokenCounter = Callable[[str], int]


def item_id(prefix: str) -> str:
    """OpenAI's id shape: a type prefix, an underscore, random hex (resp_, msg_, fc_, rs_)."""
    return f"{prefix}_{uuid.uuid4().hex}"


@dataclass(frozen=True)
class ResponseHead:
    """What every body of one response repeats: its id, the request as the server runs it."""

    id: str
    created_at: int
    model: ServedModel
    request: ResponsesRequest
    chat: ChatCompletionRequest  # the effective sampling settings (temperature, top_p)

    @classmethod
    def new(cls, response_id: str, model: ServedModel, request: ResponsesRequest,
            chat: ChatCompletionRequest) -> ResponseHead:
        return cls(response_id, int(time.time()), model, request, chat)


def reasoning_item(rid: str, text: str) -> dict[str, Any]:
    return {"type": "reasoning", "id": rid, "summary": [], "content": [{"type": "reasoning_text", "text": text}]}


def output_text(text: str) -> dict[str, Any]:
    return {"type": "output_text", "text": text, "annotations": [], "logprobs": []}


def message_item(mid: str, text: str | None, status: str) -> dict[str, Any]:
    """An assistant message; `text` None: no content part yet (a streamed item just opened)."""
    return {"type": "message", "id": mid, "status": status, "role": "assistant",
            "content": [] if text is None else [output_text(text)]}


def function_call_item(fid: str, call_id: str, name: str, arguments: str, status: str) -> dict[str, Any]:
    return {"type": "function_call", "id": fid, "call_id": call_id, "name": name, "arguments": arguments,
            "status": status}


def reply_items(reply: ParsedReply, calls: list[ToolCall], fin: Finished) -> list[dict[str, Any]]:
    """The output items of a whole reply: reasoning, then the message, then the calls. A reply
    with neither content nor calls still has its (empty) message, as OpenAI's always does."""
    status = "incomplete" if fin.finish_reason == "length" else "completed"
    out: list[dict[str, Any]] = []
    if reply.reasoning_content:
        out.append(reasoning_item(item_id("rs"), reply.reasoning_content))
    if reply.content or not calls:
        out.append(message_item(item_id("msg"), reply.content, status))
    out.extend(function_call_item(item_id("fc"), c.id, c.name, c.arguments, "completed") for c in calls)
    return out


def usage(fin: Finished, reasoning_tokens: int) -> dict[str, Any]:
    """Responses' usage; `reasoning_tokens` are the tokens of the reasoning text (part of
    output_tokens). cache_write_tokens is 0: what Arbor keeps of a prompt is not promised."""
    return {
        "input_tokens": fin.prompt_tokens,
        "input_tokens_details": {"cached_tokens": fin.cached_tokens, "cache_write_tokens": 0},
        "output_tokens": fin.completion_tokens,
        "output_tokens_details": {"reasoning_tokens": min(reasoning_tokens, fin.completion_tokens)},
        "total_tokens": fin.prompt_tokens + fin.completion_tokens,
    }


def reasoning_tokens(output: list[dict[str, Any]], count: TokenCounter) -> int:
    texts = [p["text"] for item in output if item["type"] == "reasoning" for p in item["content"]]
    return sum(count(t) for t in texts if t)


def _text_config(request: ResponsesRequest) -> dict[str, Any]:
    fmt = request.text.format if request.text is not None else None
    if fmt is None:
        return {"format": {"type": "text"}}
    return {"format": fmt.model_dump(mode="json", by_alias=True, exclude_none=True)}


def _tool_choice(request: ResponsesRequest) -> Any:
    choice = request.tool_choice
    if isinstance(choice, ToolChoiceFunction):
        return {"type": "function", "name": choice.name}
    return choice or "auto"


def response_body(head: ResponseHead, status: str, output: list[dict[str, Any]], fin: Finished | None = None,
                  count: TokenCounter | None = None, error: dict[str, Any] | None = None) -> dict[str, Any]:
    """The Response object: `fin` None while it runs (no usage yet). A finished one carries
    usage, llama-server `timings` and the `arbor` cache extension, as chat completions do."""
    req = head.request
    body: dict[str, Any] = {
        "id": head.id,
        "object": "response",
        "created_at": head.created_at,
        "status": status,
        "background": False,
        "error": error,
        "incomplete_details": {"reason": "max_output_tokens"} if status == "incomplete" else None,
        "instructions": req.instructions,
        "max_output_tokens": req.max_output_tokens,
        "max_tool_calls": None,
        "model": head.model.name,
        "output": output,
        "parallel_tool_calls": req.parallel_tool_calls,
        "previous_response_id": req.previous_response_id,
        "prompt_cache_key": req.prompt_cache_key,
        "reasoning": {"effort": req.reasoning.effort if req.reasoning else None, "summary": None},
        "service_tier": "default",
        "store": req.store,
        "temperature": head.chat.temperature,
        "text": _text_config(req),
        "tool_choice": _tool_choice(req),
        "tools": [{"type": "function", **t.model_dump(mode="json", exclude={"type"})} for t in req.tools or []],
        "top_p": head.chat.top_p,
        "truncation": "disabled",
        "usage": None,
        "user": None,
        "metadata": req.metadata or {},
    }
    if fin is not None:
        body["completed_at"] = int(time.time())
        body["usage"] = usage(fin, reasoning_tokens(output, count) if count is not None else 0)
        body["timings"] = timings(fin)
        body["arbor"] = arbor_extension(fin)
    return body


def final_status(fin: Finished) -> str:
    return "incomplete" if fin.finish_reason == "length" else "completed"


def whole_response(head: ResponseHead, got: Collected, reader: ReplyStream, count: TokenCounter) -> dict[str, Any]:
    """The Response of a non-streamed request: its reply read by the family's parser (`reader`)."""
    reply = reader.read(got.text)
    return response_body(head, final_status(got.fin), reply_items(reply, reader.calls, got.fin), got.fin, count)
