"""Bridge from async HTTP handlers to the engine thread.

`Generation(...)` submits at once, so a full queue is answered with 503 before any
response starts. `events()` yields the request's events as they come. If the consumer
stops early (client disconnected, handler cancelled) the request is cancelled and the
engine frees its slot at its next step. Non-streaming handlers pass the HTTP request as
`watch` so a disconnect is noticed while nothing is being sent.

Hand-off: the engine is built with `deliver_to_loop(loop)`, so each engine step's events
for every stream cross to the event loop in one `call_soon_threadsafe` (one wake-up of the
loop per step, not one per token per stream), and the sinks below run on the loop thread.
A reader that falls behind gets the text that piled up as one `TextDelta`, so it writes
one SSE chunk per wake-up however many tokens arrived.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

from fastapi import Request

from server.api.errors import APIError
from server.api.metrics import ServerMetrics
from server.engine.engine import Deliver, Engine, deliver_inline
from server.engine.scheduler import QueueFull
from server.engine.sequence import Event, Finished, GenerationRequest, TextDelta

DISCONNECT_POLL_S = 0.25


def deliver_to_loop(loop: asyncio.AbstractEventLoop) -> Deliver:
    """The engine's `deliver` for the HTTP server: run one step's sinks on `loop`."""

    def deliver(events) -> None:
        loop.call_soon_threadsafe(deliver_inline, events)

    return deliver


def coalesce(events: list[Event]) -> list[Event]:
    """Join runs of consecutive text deltas into one (order and content unchanged)."""
    out: list[Event] = []
    for event in events:
        last = out[-1] if out else None
        if isinstance(event, TextDelta) and isinstance(last, TextDelta):
            out[-1] = TextDelta(last.text + event.text, last.tokens + event.tokens)
        else:
            out.append(event)
    return out


class Generation:
    def __init__(self, engine: Engine, request: GenerationRequest, metrics: ServerMetrics):
        self._engine = engine
        self._metrics = metrics
        self._loop = asyncio.get_running_loop()
        self._pending: list[Event] = []
        self._wakeup: asyncio.Future | None = None
        self._finished = False
        try:
            self.seq = engine.submit(request, self._sink)
        except QueueFull as exc:
            raise APIError(f"server busy: {exc}; retry later", status=503, type="unavailable_error",
                           code="queue_full", headers={"Retry-After": "2"}) from exc

    def _sink(self, event: Event) -> None:
        # Runs on the event loop (see deliver_to_loop). Metrics are counted here, not by the
        # reader, so a request whose client went away is still counted (as cancelled).
        if isinstance(event, Finished):
            self._metrics.observe(event)
        self._pending.append(event)
        if self._wakeup is not None and not self._wakeup.done():
            self._wakeup.set_result(None)

    async def _take(self, watch: Request | None) -> list[Event] | None:
        """Everything delivered since the last call (waiting for at least one event);
        None when `watch` reports the client gone."""
        while not self._pending:
            self._wakeup = self._loop.create_future()
            if watch is None:
                await self._wakeup
                continue
            try:
                await asyncio.wait_for(self._wakeup, timeout=DISCONNECT_POLL_S)
            except asyncio.TimeoutError:
                if await watch.is_disconnected():
                    return None
        events, self._pending = self._pending, []
        return coalesce(events)

    async def events(self, watch: Request | None = None) -> AsyncIterator[Event]:
        try:
            while True:
                events = await self._take(watch)
                if events is None:
                    return
                for event in events:
                    if isinstance(event, Finished):
                        self._finished = True
                        yield event
                        return
                    yield event
        finally:
            if not self._finished:
                self._engine.cancel(self.seq)
