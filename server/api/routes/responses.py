"""POST /v1/responses (streamed or not), GET and DELETE /v1/responses/{id}: OpenAI's Responses
API, translated to and from the chat path (server.api.protocols.openai_responses)."""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter, Depends, Request
from fastapi.responses import StreamingResponse

from server.api.engine_bridge.choices import Choices
from server.api.engine_bridge.generation import engine_error
from server.api.engine_bridge.prompting import prepare_chat
from server.api.http.deps import ModelDep, StateDep, require_api_key
from server.api.http.errors import APIError
from server.api.protocols.openai_body import ServedModel
from server.api.protocols.openai_responses.events import ResponseEvents
from server.api.protocols.openai_responses.output import ResponseHead, final_status, item_id, reply_items, response_body
from server.api.protocols.openai_responses.request import ResponsesRequest
from server.api.protocols.openai_responses.store import ResponseStore, StoredResponse
from server.api.protocols.openai_responses.translate import PlannedResponse, plan_response
from server.bootstrap import LoadedModel
from server.engine.sequence import Finished

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
    prepared = prepare_chat(planned.chat, model, state.settings, request)
    choices = Choices(model.engine, prepared.generation, 1, state.metrics)
    head = ResponseHead.new(rid, ServedModel(model.model_name, model.system_fingerprint), body, planned.chat)
    count = _counter(model)

    if not body.stream:
        got = await choices.collect(request)
        if got is None:  # client went away; nobody reads this
            return APIError("client disconnected", status=499).response()
        reader = prepared.reply_stream()
        reply = reader.read(got[0].text)
        fin = got[0].fin
        answer = response_body(head, final_status(fin), reply_items(reply, reader.calls, fin), fin, count)
        _keep(store, body, planned, answer)
        return answer

    async def stream():
        events = ResponseEvents(head, prepared.reply_stream(), count)
        try:  # the reply's parser is a native object: freed however the stream ends
            yield events.opening()
            async for _, ev in choices.events():
                if not isinstance(ev, Finished):
                    frames = events.delta(ev)
                    if frames:
                        yield frames
                    continue
                if ev.finish_reason == "error":
                    yield events.failed(engine_error(ev))
                    return
                frames, answer = events.finish(ev)
                _keep(store, body, planned, answer)  # before the last event: a client may continue at once
                yield frames
                return
        finally:
            events.close()

    return StreamingResponse(stream(), media_type="text/event-stream",
                             headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"})


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
