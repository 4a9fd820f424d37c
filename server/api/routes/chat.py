"""POST /v1/chat/completions (streaming and not)."""

from __future__ import annotations

import time

from fastapi import APIRouter, Depends, Request
from fastapi.responses import StreamingResponse

from server.api import responses as R
from server.api.deps import ModelDep, StateDep, require_api_key
from server.api.errors import APIError
from server.api.generation import Generation, engine_error
from server.api.prompting import prepare_chat
from server.api.schemas import ChatCompletionRequest
from server.api.tool_calls import ContentDelta, ParsedToolCall, ToolCallStreamParser
from server.engine.sequence import Finished

router = APIRouter(dependencies=[Depends(require_api_key)])


@router.post("/v1/chat/completions")
async def chat_completions(body: ChatCompletionRequest, request: Request, state: StateDep, model: ModelDep):
    prepared = prepare_chat(body, model, state.settings, request)
    generation = Generation(model.engine, prepared.generation, state.metrics)
    rid, name = R.new_id("chatcmpl"), model.served
    parser = ToolCallStreamParser(set(prepared.tool_names)) if prepared.tool_names else None

    if not body.stream:
        text: list[str] = []
        fin: Finished | None = None
        async for ev in generation.events(watch=request):
            if isinstance(ev, Finished):
                fin = ev
            else:
                text.append(ev.text)
        if fin is None:  # client went away; nobody reads this
            return APIError("client disconnected", status=499).response()
        if fin.finish_reason == "error":
            raise engine_error(fin)
        full = "".join(text)
        if parser is None:
            return R.chat_completion(rid, name, full, [], fin)
        parts = parser.feed(full) + parser.finish()
        content = "".join(p.text for p in parts if isinstance(p, ContentDelta))
        return R.chat_completion(rid, name, content, parser.calls, fin)

    include_usage = bool(body.stream_options and body.stream_options.include_usage)

    async def stream():
        created = int(time.time())
        yield R.sse(R.chat_chunk(rid, name, created, {"role": "assistant", "content": ""}))
        content_frame = R.sse_with_text(R.chat_chunk(rid, name, created, {"content": R.TEXT_SLOT}))
        n_calls = 0

        def emit(parts) -> list[str]:
            nonlocal n_calls
            out = []
            for p in parts:
                if isinstance(p, ContentDelta):
                    if p.text:
                        out.append(content_frame(p.text))
                elif isinstance(p, ParsedToolCall):
                    out.append(R.sse(R.chat_chunk(rid, name, created, {"tool_calls": [p.as_openai(n_calls)]})))
                    n_calls += 1
            return out

        async for ev in generation.events():
            if isinstance(ev, Finished):
                if ev.finish_reason == "error":
                    yield R.error_event(engine_error(ev))
                    break
                tail = emit(parser.finish() if parser else [])
                reason = R.finish_reason(ev, parser.calls if parser else [])
                last_extra = {"timings": R.timings(ev), "arbor": R.arbor_extension(ev)}
                tail.append(R.sse(R.chat_chunk(rid, name, created, {}, reason, last_extra)))
                if include_usage:
                    tail.append(R.sse(R.usage_chunk(rid, name, created, ev, "chat.completion.chunk")))
                tail.append(R.sse("[DONE]"))
                yield "".join(tail)  # one write for the end of the stream
                return
            # one write per wake-up: the deltas that arrived together were joined by events()
            frames = emit(parser.feed(ev.text) if parser else [ContentDelta(ev.text)])
            if frames:
                yield "".join(frames)
        yield R.sse("[DONE]")

    return StreamingResponse(stream(), media_type="text/event-stream",
                             headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"})
