"""POST /v1/chat/completions (streaming and not; n choices; logprobs)."""

from __future__ import annotations

import functools
import time

from fastapi import APIRouter, Depends, Request
from fastapi.responses import StreamingResponse

from server.api import responses as R
from server.api.chat_stream import ChatChoiceStream
from server.api.engine_bridge.choices import Choices
from server.api.engine_bridge.generation import Collected, engine_error
from server.api.engine_bridge.prompting import PreparedRequest, prepare_chat
from server.api.http.deps import ModelDep, StateDep, require_api_key
from server.api.http.errors import APIError
from server.api.protocols.logprob_format import chat_logprobs
from server.api.schemas import ChatCompletionRequest
from server.engine.sequence import Finished

router = APIRouter(dependencies=[Depends(require_api_key)])


def _choice(got: Collected, prepared: PreparedRequest, piece) -> R.ChoiceOut:
    logprobs = chat_logprobs(got.logprobs, piece) if piece is not None else None
    reader = prepared.reply_stream()
    reply = reader.read(got.text)
    return R.ChoiceOut(reply.content, got.fin, reader.calls, logprobs, reply.reasoning_content)


@router.post("/v1/chat/completions")
async def chat_completions(body: ChatCompletionRequest, request: Request, state: StateDep, model: ModelDep):
    prepared = prepare_chat(body, model, state.settings, request)
    choices = Choices(model.engine, prepared.generation, body.n, state.metrics)
    rid, name = R.new_id("chatcmpl"), R.ServedModel(model.model_name, model.system_fingerprint)
    piece = functools.partial(model.runtime.piece, special=True) if body.logprobs_k is not None else None

    if not body.stream:
        got = await choices.collect(request)
        if got is None:  # client went away; nobody reads this
            return APIError("client disconnected", status=499).response()
        return R.chat_completion(rid, name, [_choice(c, prepared, piece) for c in got])

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
                yield R.error_event(engine_error(ev))
                break
            fins[index] = ev
            tail = outs[index].finish(ev)
            done = [f for f in fins if f is not None]
            if len(done) == len(fins):  # every choice has finished
                if include_usage:
                    tail += R.sse(R.usage_chunk(rid, name, created, done, "chat.completion.chunk"))
                yield tail + R.sse("[DONE]")  # one write for the end of the stream
                return
            yield tail
        yield R.sse("[DONE]")

    return StreamingResponse(stream(), media_type="text/event-stream",
                             headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"})
