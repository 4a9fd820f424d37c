"""One engine request, read from the event loop.

`Generation(...)` submits at once, so a full queue is answered with 503 before any
response starts. `events()` yields the request's events as they come. If the consumer
stops early (client disconnected, handler cancelled) the request is cancelled and the
engine frees its slot at its next step. Non-streaming handlers pass a `ClientWatch`, which
cancels the request the moment its client disconnects, while nothing is being sent.

The engine is built with a `LoopDelivery` (server.api.engine_bridge.loop_delivery), so the
sinks below run on the loop thread, one engine step (or one stream interval) at a time. A
reader that falls behind gets the text that piled up as one `TextDelta`, so it writes one SSE
chunk per wake-up.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from dataclasses import dataclass, field

from server.api.http import otel
from server.api.http.client_watch import ClientWatch
from server.api.http.errors import APIError
from server.api.http.metrics import ServerMetrics
from server.engine.engine import Engine
from server.engine.logprobs import TokenLogprob
from server.engine.scheduler import QueueFull
from server.engine.sequence import Event, Finished, GenerationRequest, TextDelta


def coalesce(events: list[Event]) -> list[Event]:
    """Join runs of consecutive text deltas into one (order and content unchanged)."""
    out: list[Event] = []
    for event in events:
        last = out[-1] if out else None
        if isinstance(event, TextDelta) and isinstance(last, TextDelta):
            out[-1] = TextDelta(last.text + event.text, last.tokens + event.tokens, last.logprobs + event.logprobs)
        else:
            out.append(event)
    return out


def engine_error(fin: Finished) -> APIError:
    """The HTTP error for a request the engine finished with an error: 503 + Retry-After
    when it lacked resources for a moment (a full KV pool), else 500."""
    if fin.retryable:
        return APIError(f"server busy: {fin.error}", status=503, type="unavailable_error", code="kv_cache_full",
                        headers={"Retry-After": "2"})
    return APIError(f"generation failed: {fin.error}", status=500, type="server_error")


@dataclass(frozen=True)
class Collected:
    """A whole non-streamed answer: its text, its tokens, their log-probabilities (when
    asked for) and how it ended."""

    text: str
    tokens: list[int]
    fin: Finished
    logprobs: list[TokenLogprob] = field(default_factory=list)


class Generation:
    def __init__(self, engine: Engine, request: GenerationRequest, metrics: ServerMetrics):
        self._engine = engine
        self._metrics = metrics
        self._loop = asyncio.get_running_loop()
        self._pending: list[Event] = []
        self._wakeup: asyncio.Future | None = None
        self._finished = False
        self._gone = False
        self._span = otel.current_span()  # the request's span, when spans are exported (http/otel.py)
        try:
            self.seq = engine.submit(request, self._sink)
        except QueueFull as exc:
            raise APIError(f"server busy: {exc}; retry later", status=503, type="unavailable_error",
                           code="queue_full", headers={"Retry-After": "2"}) from exc

    def _sink(self, event: Event) -> None:
        # Runs on the event loop (see loop_delivery). Metrics are counted here, not by the
        # reader, so a request whose client went away is still counted (as cancelled).
        if isinstance(event, Finished):
            self._metrics.observe(event)
            otel.annotate(self._span, event)
        self._pending.append(event)
        if self._wakeup is not None and not self._wakeup.done():
            self._wakeup.set_result(None)

    def _client_gone(self) -> None:
        """The client disconnected (event loop): cancel now, wake the reader to stop."""
        self._gone = True
        if not self._finished:
            self._engine.cancel(self.seq)
        if self._wakeup is not None and not self._wakeup.done():
            self._wakeup.set_result(None)

    async def _take(self) -> list[Event] | None:
        """Everything delivered since the last call (waiting for at least one event);
        None once the client is gone."""
        while not self._pending and not self._gone:
            self._wakeup = self._loop.create_future()
            await self._wakeup
        if self._gone:
            return None
        events, self._pending = self._pending, []
        return coalesce(events)

    async def events(self, watch: ClientWatch | None = None) -> AsyncIterator[Event]:
        if watch is not None:
            watch.on_gone(self._client_gone)
        try:
            while True:
                events = await self._take()
                if events is None:
                    return
                for event in events:
                    if isinstance(event, Finished):
                        self._finished = True
                        yield event
                        return
                    yield event
        finally:
            if not self._finished:  # the client left (a disconnect, a cancelled stream)
                self._engine.cancel(self.seq)
                self._metrics.abandoned.inc()

    async def collect(self, watch: ClientWatch) -> Collected | None:
        """Run to the end for a non-streaming answer; None if the client went away, raises
        the HTTP error of a request the engine finished with an error."""
        parts: list[str] = []
        tokens: list[int] = []
        logprobs: list[TokenLogprob] = []
        async for ev in self.events(watch=watch):
            if isinstance(ev, Finished):
                if ev.finish_reason == "error":
                    raise engine_error(ev)
                return Collected("".join(parts), tokens, ev, logprobs)
            parts.append(ev.text)
            tokens.extend(ev.tokens)
            logprobs.extend(ev.logprobs)
        return None
