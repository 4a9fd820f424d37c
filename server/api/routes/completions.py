"""POST /v1/completions (raw text or token ids in, text out)."""

from __future__ import annotations

import time

from fastapi import APIRouter, Depends, Request
from fastapi.responses import StreamingResponse

from server.api import responses as R
from server.api.deps import ModelDep, StateDep, require_api_key
from server.api.errors import APIError
from server.api.generation import Generation, engine_error
from server.api.prompting import prepare_completion
from server.api.schemas import CompletionRequest
from server.engine.sequence import Finished

router = APIRouter(dependencies=[Depends(require_api_key)])


@router.post("/v1/completions")
async def completions(body: CompletionRequest, request: Request, state: StateDep, model: ModelDep):
    prepared = prepare_completion(body, model, state.settings, request)
    generation = Generation(model.engine, prepared.generation, state.metrics)
    rid, name = R.new_id("cmpl"), model.served
    prefix = prepared.prompt_text if body.echo and prepared.prompt_text else ""

    if not body.stream:
        got = await generation.collect(watch=request)
        if got is None:
            return APIError("client disconnected", status=499).response()
        return R.text_completion(rid, name, prefix + got.text, got.fin)

    include_usage = bool(body.stream_options and body.stream_options.include_usage)

    async def stream():
        created = int(time.time())
        text_frame = R.sse_with_text(R.text_chunk(rid, name, created, R.TEXT_SLOT))
        if prefix:
            yield text_frame(prefix)
        async for ev in generation.events():
            if isinstance(ev, Finished):
                if ev.finish_reason == "error":
                    yield R.error_event(engine_error(ev))
                    break
                last = R.text_chunk(rid, name, created, "", ev.finish_reason)
                last.update({"timings": R.timings(ev), "arbor": R.arbor_extension(ev)})
                tail = [R.sse(last)]
                if include_usage:
                    tail.append(R.sse(R.usage_chunk(rid, name, created, ev, "text_completion")))
                tail.append(R.sse("[DONE]"))
                yield "".join(tail)  # one write for the end of the stream
                return
            yield text_frame(ev.text)
        yield R.sse("[DONE]")

    return StreamingResponse(stream(), media_type="text/event-stream", headers={"Cache-Control": "no-cache"})
