"""POST /v1/messages and /v1/messages/count_tokens: Anthropic's Messages API
(server.api.protocols.anthropic_messages).

The body is read and validated here rather than by FastAPI, so a bad request's message names
Anthropic's fields (messages.0.content.1, ...); errors take Anthropic's format on these paths
(protocols.anthropic_messages.errors.AnthropicErrors, installed by the app).
"""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter, Depends, Request

from server.api.engine_bridge.choices import Choices
from server.api.http.cache_fields import read_cache_scope
from server.api.http.deps import ModelDep, StateDep, require_api_key
from server.api.http.errors import invalid
from server.api.protocols.anthropic_messages.events import MessageEvents
from server.api.protocols.anthropic_messages.prepare import count_tokens, prepare_messages
from server.api.protocols.anthropic_messages.reply import new_message_id, whole_message
from server.api.protocols.anthropic_messages.request import CountTokensRequest, MessagesRequest, parse_request
from server.api.streaming.driver import stream_response, whole_answer

router = APIRouter(dependencies=[Depends(require_api_key)])


async def _json(request: Request) -> Any:
    try:
        return await request.json()
    except ValueError:
        raise invalid("request body is not valid JSON") from None


@router.post("/v1/messages")
async def messages(request: Request, state: StateDep, model: ModelDep):
    body = parse_request(MessagesRequest, await _json(request))
    scope = read_cache_scope(request, state.settings, cache=body.cache, cache_salt=body.cache_salt)
    prepared, prompt_cache = prepare_messages(body, model, state.settings, scope)
    choices = Choices(model.engine, prepared.generation, 1, state.metrics)
    mid, stops = new_message_id(), body.stop_sequences or []

    if not body.stream:
        return await whole_answer(choices, request, lambda got: whole_message(
            mid, model.model_name, got[0], prepared.reply_stream(), stops, prompt_cache))
    return stream_response(choices, lambda: MessageEvents(
        mid, model.model_name, prepared.reply_stream(), len(prepared.generation.prompt_tokens), prompt_cache, stops))


@router.post("/v1/messages/count_tokens")
async def messages_count_tokens(request: Request, state: StateDep, model: ModelDep):
    body = parse_request(CountTokensRequest, await _json(request))
    return {"input_tokens": count_tokens(body, model, state.settings)}
