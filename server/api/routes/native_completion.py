"""POST /completion: llama-server's native completion endpoint (server.api.protocols.llama_server:
its request, its answer whole and streamed)."""

from __future__ import annotations

import functools

from fastapi import APIRouter, Depends, Request
from fastapi.responses import StreamingResponse

from server.api.engine_bridge.generation import Generation, engine_error
from server.api.engine_bridge.prompting import prepare_completion
from server.api.http.client_watch import ClientWatch
from server.api.http.deps import ModelDep, StateDep, require_api_key
from server.api.http.errors import APIError
from server.api.protocols.llama_server.reply import completion_body, whole_completion
from server.api.protocols.llama_server.request import NativeCompletionRequest
from server.api.protocols.logprob_format import native_probabilities
from server.api.streaming.sse import error_event, sse
from server.engine.sequence import Finished

router = APIRouter(dependencies=[Depends(require_api_key)])


@router.post("/completion")
async def completion(body: NativeCompletionRequest, request: Request, state: StateDep, model: ModelDep):
    prepared = prepare_completion(body.as_completion(), model, state.settings, request)
    generation = Generation(model.engine, prepared.generation, state.metrics)
    name, n_prompt = model.model_name, len(prepared.generation.prompt_tokens)
    piece = functools.partial(model.runtime.piece, special=True) if body.n_probs else None

    if not body.stream:
        async with ClientWatch(request) as watch:
            got = await generation.collect(watch)
        if got is None:
            return APIError("client disconnected", status=499).response()
        return whole_completion(name, got, prepared.prompt_text, body.return_tokens, piece)

    async def stream():
        n_predicted = 0
        async for ev in generation.events():
            if isinstance(ev, Finished):
                if ev.finish_reason == "error":
                    yield error_event(engine_error(ev))
                else:
                    yield sse(completion_body(name, "", None, prepared.prompt_text, ev))
                return
            n_predicted += len(ev.tokens)
            chunk = {"index": 0, "content": ev.text, "tokens": list(ev.tokens) if body.return_tokens else [],
                     "stop": False, "id_slot": -1, "tokens_predicted": n_predicted, "tokens_evaluated": n_prompt}
            if piece is not None:
                chunk["completion_probabilities"] = native_probabilities(ev.logprobs, piece)
            yield sse(chunk)

    return StreamingResponse(stream(), media_type="text/event-stream", headers={"Cache-Control": "no-cache"})
