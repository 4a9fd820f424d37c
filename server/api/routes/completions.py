"""POST /v1/completions (raw text or token ids in, text out; n choices; logprobs)."""

from __future__ import annotations

import functools
import time

from fastapi import APIRouter, Depends, Request
from fastapi.responses import StreamingResponse

from server.api.engine_bridge.choices import Choices
from server.api.engine_bridge.generation import engine_error
from server.api.engine_bridge.prompting import prepare_completion
from server.api.http.deps import ModelDep, StateDep, require_api_key
from server.api.http.errors import APIError
from server.api.protocols.finish_report import arbor_extension, timings
from server.api.protocols.logprob_format import completion_logprobs
from server.api.protocols.openai_body import ServedModel, new_id, usage_chunk
from server.api.protocols.openai_completions.reply import text_chunk, whole_text_completion
from server.api.protocols.openai_completions.request import CompletionRequest
from server.api.streaming.sse import TEXT_SLOT, error_event, sse, sse_with_text
from server.engine.sequence import Finished

router = APIRouter(dependencies=[Depends(require_api_key)])


@router.post("/v1/completions")
async def completions(body: CompletionRequest, request: Request, state: StateDep, model: ModelDep):
    prepared = prepare_completion(body, model, state.settings, request)
    choices = Choices(model.engine, prepared.generation, body.n, state.metrics)
    rid, name = new_id("cmpl"), ServedModel(model.model_name, model.system_fingerprint)
    prefix = prepared.prompt_text if body.echo and prepared.prompt_text else ""
    piece = functools.partial(model.runtime.piece, special=True) if body.logprobs_k is not None else None

    if not body.stream:
        got = await choices.collect(request)
        if got is None:
            return APIError("client disconnected", status=499).response()
        return whole_text_completion(rid, name, got, prefix, piece)

    include_usage = bool(body.stream_options and body.stream_options.include_usage)

    async def stream():
        created = int(time.time())
        frames = [sse_with_text(text_chunk(rid, name, created, TEXT_SLOT, index=i)) for i in range(body.n)]
        offsets = [len(prefix)] * body.n  # where each choice's next text starts (logprobs' text_offset)
        fins: list[Finished | None] = [None] * body.n
        if prefix:
            yield "".join(frame(prefix) for frame in frames)
        async for index, ev in choices.events():
            if not isinstance(ev, Finished):
                if piece is None:
                    yield frames[index](ev.text)
                else:
                    lp = completion_logprobs(ev.logprobs, piece, offsets[index])
                    yield sse(text_chunk(rid, name, created, ev.text, index=index, logprobs=lp))
                offsets[index] += len(ev.text)
                continue
            if ev.finish_reason == "error":
                yield error_event(engine_error(ev))
                break
            fins[index] = ev
            last = text_chunk(rid, name, created, "", ev.finish_reason, index=index)
            last.update({"timings": timings(ev), "arbor": arbor_extension(ev)})
            tail = sse(last)
            done = [f for f in fins if f is not None]
            if len(done) == len(fins):  # every choice has finished
                if include_usage:
                    tail += sse(usage_chunk(rid, name, created, done, "text_completion"))
                yield tail + sse("[DONE]")  # one write for the end of the stream
                return
            yield tail
        yield sse("[DONE]")

    return StreamingResponse(stream(), media_type="text/event-stream", headers={"Cache-Control": "no-cache"})
