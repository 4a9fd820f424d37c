"""The one stream driver: every protocol's streamed answer is this loop with the protocol's writer.

The driver owns the loop; the writer (`StreamWriter`) only says how its protocol writes each
part. Per request, the driver:

- opens the writer inside the stream, so what the writer holds (the family's reply parsers,
  native objects) is made only once the answer starts and is closed however it ends (the end,
  an engine error, the client leaving: Starlette then cancels the stream);
- pulls the engine's events of every choice (`Choices.events`: text that piled up while the
  stream was writing arrives as one delta, and with --stream-interval-ms the engine's hand-off,
  engine_bridge.loop_delivery, delivers at most one batch per interval), and writes each
  choice's deltas as they come, one write per wake-up;
- on an engine error (`Finished` with reason "error") writes the writer's error event and
  stops: the other choices are cancelled as the events stop being read;
- gathers every choice's `Finished` and, once all have finished, writes the last choice's
  finish and the writer's end (its usage, its terminator) as one write.

Writes that come out empty are skipped (a delta the parser holds back writes nothing). A
non-streamed answer goes through `whole_answer`: every choice to its end, then the protocol
formats it; a client that leaves first gets a 499 and its choices are cancelled at once.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable, Mapping
from typing import Any, Protocol

from fastapi import Request
from fastapi.responses import StreamingResponse

from server.api.engine_bridge.choices import Choices
from server.api.engine_bridge.generation import Collected, engine_error
from server.api.http.client_watch import ClientWatch
from server.api.http.errors import APIError
from server.engine.sequence import Finished, TextDelta

# What an event stream is sent with: never cached, never held back by a buffering proxy (nginx).
SSE_HEADERS = {"Cache-Control": "no-cache", "X-Accel-Buffering": "no"}
# The text completion endpoints' streams have always been sent without the proxy hint.
NO_CACHE_HEADERS = {"Cache-Control": "no-cache"}


class StreamWriter(Protocol):
    """How one protocol writes a streamed answer, as text frames. The driver calls `opening`
    once, then `delta` and `finish` as choice `index`'s events come, then either `error` (once,
    on an engine error, after which nothing more is written but an end) or nothing more, then
    `end` once, then `close` (always, also when the client left mid-stream)."""

    def opening(self) -> str:
        """The frames before any text ("" for none)."""
        ...

    def delta(self, index: int, event: TextDelta) -> str:
        """The frames of choice `index`'s new text ("" while the parser holds it back)."""
        ...

    def finish(self, index: int, fin: Finished) -> str:
        """Choice `index`'s last frames (what the strict reading of its reply adds, its end)."""
        ...

    def error(self, error: APIError) -> str:
        """The frame of an engine error after the stream began (its status is 200 already)."""
        ...

    def end(self, fins: list[Finished] | None) -> str:
        """The frames after the last choice's finish: `fins`, every choice's, when all finished
        (the usage), None after an error or an early end of the events ("" for none)."""
        ...

    def close(self) -> None:
        """Free what the writer holds."""
        ...


async def stream_frames(choices: Choices, open_writer: Callable[[], StreamWriter]) -> AsyncIterator[str]:
    """The frames of a streamed answer of `choices`, as `open_writer()`'s protocol writes them."""
    writer = open_writer()
    try:
        opening = writer.opening()
        if opening:
            yield opening
        fins: list[Finished | None] = [None] * len(choices.generations)
        async for index, ev in choices.events():
            if not isinstance(ev, Finished):
                frames = writer.delta(index, ev)
                if frames:  # one write per wake-up: deltas that arrived together were joined
                    yield frames
                continue
            if ev.finish_reason == "error":
                yield writer.error(engine_error(ev))
                break
            fins[index] = ev
            tail = writer.finish(index, ev)
            done = [f for f in fins if f is not None]
            if len(done) == len(fins):  # every choice has finished
                yield tail + writer.end(done)  # one write for the end of the stream
                return
            yield tail
        tail = writer.end(None)
        if tail:
            yield tail
    finally:  # a writer's reply parsers are native objects: freed however the stream ends
        writer.close()


def stream_response(choices: Choices, open_writer: Callable[[], StreamWriter],
                    headers: Mapping[str, str] = SSE_HEADERS) -> StreamingResponse:
    """The streamed HTTP answer (text/event-stream) of `choices`."""
    return StreamingResponse(stream_frames(choices, open_writer), media_type="text/event-stream",
                             headers=dict(headers))


async def whole_answer(choices: Choices, request: Request, answer: Callable[[list[Collected]], Any]) -> Any:
    """`answer(every choice's whole text)`, once all have finished; 499 when the client went away
    first (nobody reads it); raises the HTTP error of a choice the engine finished with an error."""
    async with ClientWatch(request) as watch:
        got = await choices.collect(watch)
    if got is None:
        return APIError("client disconnected", status=499).response()
    return answer(got)
