"""POST /v1/completions (raw text or token ids in, text out; n choices; logprobs): OpenAI's
text completions (server.api.protocols.openai_completions)."""

from __future__ import annotations

import functools

from fastapi import APIRouter, Depends, Request

from server.api.engine_bridge.choices import Choices
from server.api.engine_bridge.completion_request import CompletionRequest
from server.api.engine_bridge.prompting import prepare_completion
from server.api.http.cache_fields import read_cache_scope
from server.api.http.deps import ModelDep, StateDep, require_api_key
from server.api.protocols.openai_body import ServedModel, new_id
from server.api.protocols.openai_completions.reply import whole_text_completion
from server.api.protocols.openai_completions.stream import CompletionStreamWriter
from server.api.streaming.driver import NO_CACHE_HEADERS, stream_response, whole_answer

router = APIRouter(dependencies=[Depends(require_api_key)])


@router.post("/v1/completions")
async def completions(body: CompletionRequest, request: Request, state: StateDep, model: ModelDep):
    scope = read_cache_scope(request, state.settings, cache=body.cache, prompt_cache_key=body.prompt_cache_key,
                             cache_salt=body.cache_salt)
    prepared = prepare_completion(body, model, state.settings, scope)
    choices = Choices(model.engine, prepared.generation, body.n, state.metrics)
    rid, name = new_id("cmpl"), ServedModel(model.model_name, model.system_fingerprint)
    prefix = prepared.prompt_text if body.echo and prepared.prompt_text else ""
    piece = functools.partial(model.runtime.piece, special=True) if body.logprobs_k is not None else None

    if not body.stream:
        return await whole_answer(choices, request, lambda got: whole_text_completion(rid, name, got, prefix, piece))
    include_usage = bool(body.stream_options and body.stream_options.include_usage)
    return stream_response(choices, lambda: CompletionStreamWriter(rid, name, body.n, prefix, piece, include_usage),
                           headers=NO_CACHE_HEADERS)
