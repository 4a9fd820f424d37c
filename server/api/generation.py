"""Bridge from async HTTP handlers to the engine thread.

`Generation(...)` submits at once, so a full queue is answered with 503 before any
response starts. `events()` yields the request's events as they come. If the consumer
stops early (client disconnected, handler cancelled) the request is cancelled and the
engine frees its slot at its next step. Non-streaming handlers pass the HTTP request as
`watch` so a disconnect is noticed while nothing is being sent.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from dataclasses import dataclass

from fastapi import Request

from server.api.errors import APIError
from server.api.metrics import ServerMetrics
from server.engine.engine import Engine
from server.engine.scheduler import QueueFull
from server.engine.sequence import Finished, GenerationRequest, TextDelta

DISCONNECT_POLL_S = 0.25


def engine_error(fin: Finished) -> APIError:
    """The HTTP error for a request the engine finished with an error: 503 + Retry-After
    when it lacked resources for a moment (a full KV pool), else 500."""
    if fin.retryable:
        return APIError(f"server busy: {fin.error}", status=503, type="unavailable_error", code="kv_cache_full",
                        headers={"Retry-After": "2"})
    return APIError(f"generation failed: {fin.error}", status=500, type="server_error")


@dataclass(frozen=True)
class Collected:
    """A whole non-streamed answer: its text, its tokens and how it ended."""

    text: str
    tokens: list[int]
    fin: Finished


class Generation:
    def __init__(self, engine: Engine, request: GenerationRequest, metrics: ServerMetrics):
        self._engine = engine
        self._metrics = metrics
        self._loop = asyncio.get_running_loop()
        self._queue: asyncio.Queue[TextDelta | Finished] = asyncio.Queue()
        self._finished = False
        try:
            self.seq = engine.submit(request, self._sink)
        except QueueFull as exc:
            raise APIError(f"server busy: {exc}; retry later", status=503, type="unavailable_error",
                           code="queue_full", headers={"Retry-After": "2"}) from exc

    def _sink(self, event: TextDelta | Finished) -> None:
        # Runs on the engine thread. Metrics are counted here, not by the reader, so a
        # request whose client went away is still counted (as cancelled).
        if isinstance(event, Finished):
            self._metrics.observe(event)
        self._loop.call_soon_threadsafe(self._queue.put_nowait, event)

    async def events(self, watch: Request | None = None) -> AsyncIterator[TextDelta | Finished]:
        try:
            while True:
                if watch is None:
                    event = await self._queue.get()
                else:
                    try:
                        event = await asyncio.wait_for(self._queue.get(), timeout=DISCONNECT_POLL_S)
                    except asyncio.TimeoutError:
                        if await watch.is_disconnected():
                            return
                        continue
                if isinstance(event, Finished):
                    self._finished = True
                    yield event
                    return
                yield event
        finally:
            if not self._finished:
                self._engine.cancel(self.seq)

    async def collect(self, watch: Request) -> Collected | None:
        """Run to the end for a non-streaming answer; None if the client went away, raises
        the HTTP error of a request the engine finished with an error."""
        parts: list[str] = []
        tokens: list[int] = []
        async for ev in self.events(watch=watch):
            if isinstance(ev, Finished):
                if ev.finish_reason == "error":
                    raise engine_error(ev)
                return Collected("".join(parts), tokens, ev)
            parts.append(ev.text)
            tokens.extend(ev.tokens)
        return None
