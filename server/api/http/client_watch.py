"""Noticing, at any moment, that the HTTP client of a non-streamed request went away.

A non-streamed request sends nothing until it ends, so writing cannot reveal a closed
connection. Once the body has been read, the next ASGI message of the request is
`http.disconnect`: one task per request waits for it and runs the callbacks registered
by its generations, which cancel their engine sequences at once, whether they wait in
the queue, prefill or decode. (Streamed responses need none of this: Starlette listens
for the disconnect itself and cancels the stream, whose generation then cancels.)

Use as `async with ClientWatch(request) as watch:`; leaving the block stops listening.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable

from fastapi import Request


class ClientWatch:
    def __init__(self, request: Request, on_gone: Callable[[], None] | None = None):
        """`on_gone` runs once, on the event loop, when the client disconnects (before the
        per-generation callbacks); the server counts disconnects with it."""
        self._receive = request.receive
        self._callbacks: list[Callable[[], None]] = [on_gone] if on_gone else []
        self.gone = False
        self._task: asyncio.Task | None = None

    async def __aenter__(self) -> ClientWatch:
        self._task = asyncio.create_task(self._listen())
        return self

    async def __aexit__(self, *exc) -> None:
        if self._task is not None:
            self._task.cancel()

    def on_gone(self, callback: Callable[[], None]) -> None:
        """Run `callback` when the client leaves (at once if it has already left)."""
        if self.gone:
            callback()
        else:
            self._callbacks.append(callback)

    async def _listen(self) -> None:
        while True:
            message = await self._receive()
            if message["type"] == "http.disconnect":
                break
        self.gone = True
        callbacks, self._callbacks = self._callbacks, []
        for callback in callbacks:
            callback()
