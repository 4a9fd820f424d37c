"""POST /v1/chat/completions (streaming and not; n choices; logprobs): OpenAI's Chat Completions
(server.api.protocols.openai_chat)."""

from __future__ import annotations

import functools

from fastapi import APIRouter, Depends, Request

from server.api.engine_bridge.chat_request import ChatCompletionRequest
from server.api.engine_bridge.choices import Choices
from server.api.engine_bridge.prompting import prepare_chat
from server.api.http.cache_fields import read_cache_scope
from server.api.http.deps import ModelDep, StateDep, require_api_key
from server.api.protocols.openai_body import ServedModel, new_id
from server.api.protocols.openai_chat.reply import whole_chat_completion
from server.api.protocols.openai_chat.stream import ChatStreamWriter
from server.api.streaming.driver import stream_response, whole_answer

router = APIRouter(dependencies=[Depends(require_api_key)])


@router.post("/v1/chat/completions")
async def chat_completions(body: ChatCompletionRequest, request: Request, state: StateDep, model: ModelDep):
    scope = read_cache_scope(request, state.settings, cache=body.cache, prompt_cache_key=body.prompt_cache_key,
                             cache_salt=body.cache_salt)
    prepared = prepare_chat(body, model, state.settings, scope)
    choices = Choices(model.engine, prepared.generation, body.n, state.metrics)
    rid, name = new_id("chatcmpl"), ServedModel(model.model_name, model.system_fingerprint)
    piece = functools.partial(model.runtime.piece, special=True) if body.logprobs_k is not None else None

    if not body.stream:
        return await whole_answer(choices, request,
                                  lambda got: whole_chat_completion(rid, name, got, prepared.reply_stream, piece))
    include_usage = bool(body.stream_options and body.stream_options.include_usage)
    return stream_response(choices, lambda: ChatStreamWriter(rid, name, body.n, prepared.reply_stream, piece,
                                                             include_usage))
