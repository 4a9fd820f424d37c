"""POST /v1/chat/completions (streaming and not; n choices; logprobs)."""

from __future__ import annotations

import functools
import time

from fastapi import APIRouter, Depends, Request
from fastapi.responses import StreamingResponse

from server.api.engine_bridge.choices import Choices
from server.api.engine_bridge.generation import engine_error
from server.api.engine_bridge.prompting import prepare_chat
from server.api.http.deps import ModelDep, StateDep, require_api_key
from server.api.http.errors import APIError
from server.api.protocols.openai_body import ServedModel, new_id, usage_chunk
from server.api.protocols.openai_chat.reply import whole_chat_completion
from server.api.protocols.openai_chat.request import ChatCompletionRequest
from server.api.protocols.openai_chat.stream import ChatChoiceStream
from server.api.streaming.sse import error_event, sse
from server.engine.sequence import Finished

router = APIRouter(dependencies=[Depends(require_api_key)])


@router.post("/v1/chat/completions")
async def chat_completions(body: ChatCompletionRequest, request: Request, state: StateDep, model: ModelDep):
    prepared = prepare_chat(body, model, state.settings, request)
    choices = Choices(model.engine, prepared.generation, body.n, state.metrics)
    rid, name = new_id("chatcmpl"), ServedModel(model.model_name, model.system_fingerprint)
    piece = functools.partial(model.runtime.piece, special=True) if body.logprobs_k is not None else None

    if not body.stream:
        got = await choices.collect(request)
        if got is None:  # client went away; nobody reads this
            return APIError("client disconnected", status=499).response()
        return whole_chat_completion(rid, name, got, prepared.reply_stream, piece)

    include_usage = bool(body.stream_options and body.stream_options.include_usage)

    async def stream():
        created = int(time.time())
        outs = [ChatChoiceStream(rid, name, created, i, prepared.reply_stream(), piece) for i in range(body.n)]
        try:  # the replies' parsers are native objects: freed however the stream ends
            async for frames in _frames(outs, created):
                yield frames
        finally:
            for o in outs:
                o.close()

    async def _frames(outs: list[ChatChoiceStream], created: int):
        fins: list[Finished | None] = [None] * body.n
        yield "".join(o.opening() for o in outs)
        async for index, ev in choices.events():
            if not isinstance(ev, Finished):
                frames = outs[index].delta(ev)
                if frames:  # one write per wake-up: deltas that arrived together were joined
                    yield frames
                continue
            if ev.finish_reason == "error":
                yield error_event(engine_error(ev))
                break
            fins[index] = ev
            tail = outs[index].finish(ev)
            done = [f for f in fins if f is not None]
            if len(done) == len(fins):  # every choice has finished
                if include_usage:
                    tail += sse(usage_chunk(rid, name, created, done, "chat.completion.chunk"))
                yield tail + sse("[DONE]")  # one write for the end of the stream
                return
            yield tail
        yield sse("[DONE]")

    return StreamingResponse(stream(), media_type="text/event-stream",
                             headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"})
