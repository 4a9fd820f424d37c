"""POST /v1/responses (streamed or not), GET and DELETE /v1/responses/{id}: OpenAI's Responses
API, translated to and from the chat path (server.api.protocols.openai_responses)."""

from __future__ import annotations

import functools
from typing import Any

from fastapi import APIRouter, Depends, Request

from server.api.engine_bridge.choices import Choices
from server.api.engine_bridge.generation import Collected
from server.api.engine_bridge.prompting import prepare_chat
from server.api.http.cache_fields import read_cache_scope
from server.api.http.deps import ModelDep, StateDep, require_api_key
from server.api.http.errors import APIError
from server.api.http.response_store import ResponseStore, StoredResponse
from server.api.protocols.openai_body import ServedModel
from server.api.protocols.openai_responses.events import ResponseEvents
from server.api.protocols.openai_responses.output import ResponseHead, item_id, whole_response
from server.api.protocols.openai_responses.request import ResponsesRequest
from server.api.protocols.openai_responses.translate import PlannedResponse, plan_response
from server.api.streaming.driver import stream_response, whole_answer
from server.bootstrap import LoadedModel

router = APIRouter(dependencies=[Depends(require_api_key)])


def _not_found(response_id: str, param: str | None = None) -> APIError:
    return APIError(f"Response with id '{response_id}' not found.", status=404, type="invalid_request_error",
                    param=param, code="response_not_found")


def _counter(model: LoadedModel):
    return lambda text: len(model.runtime.tokenize(text, add_special=False, parse_special=False))


def _keep(store: ResponseStore, body: ResponsesRequest, planned: PlannedResponse, answer: dict[str, Any]) -> None:
    if body.store:
        store.put(StoredResponse(answer["id"], planned.root_id, body.previous_response_id, planned.input_items,
                                 answer))


@router.post("/v1/responses")
async def create_response(body: ResponsesRequest, request: Request, state: StateDep, model: ModelDep):
    store = state.responses
    chain = None
    if body.previous_response_id is not None:
        chain = store.chain(body.previous_response_id)
        if chain is None:
            raise _not_found(body.previous_response_id, param="previous_response_id")
    rid = item_id("resp")
    planned = plan_response(body, rid, chain, state.settings.max_messages)
    chat = planned.chat
    scope = read_cache_scope(request, state.settings, cache=chat.cache, prompt_cache_key=chat.prompt_cache_key,
                             cache_salt=chat.cache_salt)
    prepared = prepare_chat(chat, model, state.settings, scope)
    choices = Choices(model.engine, prepared.generation, 1, state.metrics)
    head = ResponseHead.new(rid, ServedModel(model.model_name, model.system_fingerprint), body, planned.chat)
    count = _counter(model)
    keep = functools.partial(_keep, store, body, planned)

    if not body.stream:
        def answer(got: list[Collected]) -> dict[str, Any]:
            response = whole_response(head, got[0], prepared.reply_stream(), count)
            keep(response)
            return response

        return await whole_answer(choices, request, answer)
    # stored before the last event is written: a client may continue from it at once
    return stream_response(choices, lambda: ResponseEvents(head, prepared.reply_stream(), count, on_finished=keep))


@router.get("/v1/responses/{response_id}")
async def get_response(response_id: str, state: StateDep):
    stored = state.responses.get(response_id)
    if stored is None:
        raise _not_found(response_id)
    return stored.body


@router.delete("/v1/responses/{response_id}")
async def delete_response(response_id: str, state: StateDep):
    if not state.responses.delete(response_id):
        raise _not_found(response_id)
    return {"id": response_id, "object": "response.deleted", "deleted": True}
