"""POST /completion: llama-server's native completion endpoint (server.api.protocols.llama_server:
its request, its answer whole and streamed)."""

from __future__ import annotations

import functools

from fastapi import APIRouter, Depends, Request

from server.api.engine_bridge.choices import Choices
from server.api.engine_bridge.prompting import prepare_completion
from server.api.http.cache_fields import read_cache_scope
from server.api.http.deps import ModelDep, StateDep, require_api_key
from server.api.protocols.llama_server.reply import whole_completion
from server.api.protocols.llama_server.request import NativeCompletionRequest
from server.api.protocols.llama_server.stream import NativeCompletionStreamWriter
from server.api.streaming.driver import NO_CACHE_HEADERS, stream_response, whole_answer

router = APIRouter(dependencies=[Depends(require_api_key)])


@router.post("/completion")
async def completion(body: NativeCompletionRequest, request: Request, state: StateDep, model: ModelDep):
    completion_request = body.as_completion()
    scope = read_cache_scope(request, state.settings, cache=completion_request.cache,
                             prompt_cache_key=completion_request.prompt_cache_key,
                             cache_salt=completion_request.cache_salt)
    prepared = prepare_completion(completion_request, model, state.settings, scope)
    choices = Choices(model.engine, prepared.generation, 1, state.metrics)
    name, n_prompt = model.model_name, len(prepared.generation.prompt_tokens)
    piece = functools.partial(model.runtime.piece, special=True) if body.n_probs else None

    if not body.stream:
        return await whole_answer(choices, request, lambda got: whole_completion(
            name, got[0], prepared.prompt_text, body.return_tokens, piece))
    return stream_response(choices, lambda: NativeCompletionStreamWriter(
        name, n_prompt, prepared.prompt_text, body.return_tokens, piece), headers=NO_CACHE_HEADERS)
