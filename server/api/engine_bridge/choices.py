"""The `n` choices of one request: n generations sampled from one prompt.

Each choice is its own engine request, so choices run side by side on separate slots and
sample independently (with a client seed, choice i uses seed + i, so choices differ yet a
rerun repeats them). They form one prefill group: the cache router lets one choice compute
the prompt while the others wait, then attaches its KV to them (seq_cp, no copy), so the
prompt is computed once (source S, docs/architecture.md; with --no-cache every choice computes it).

One choice (n=1) is passed straight through, so requests that do not ask for more pay
nothing for this.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from dataclasses import replace

from server.api.engine_bridge.generation import Collected, Generation
from server.api.http.client_watch import ClientWatch
from server.api.http.metrics import ServerMetrics
from server.engine.engine import Engine
from server.engine.sequence import Event, GenerationRequest


def choice_requests(request: GenerationRequest, n: int) -> list[GenerationRequest]:
    if n == 1:
        return [request]
    group = object()
    seed = request.sampling.seed
    return [replace(request, prefill_group=group,
                    sampling=request.sampling if seed is None else replace(request.sampling, seed=seed + i))
            for i in range(n)]


class Choices:
    """Submits every choice at once (a full queue refuses the whole request, none is left
    running) and reads them back together."""

    def __init__(self, engine: Engine, request: GenerationRequest, n: int, metrics: ServerMetrics):
        self._engine = engine
        self.generations: list[Generation] = []
        try:
            for r in choice_requests(request, n):
                self.generations.append(Generation(engine, r, metrics))
        except BaseException:
            self.cancel()
            raise

    def cancel(self) -> None:
        for g in self.generations:
            self._engine.cancel(g.seq)

    async def collect(self, watch: ClientWatch) -> list[Collected] | None:
        """Every choice to its end; None if the client went away (`watch` says so: every choice
        is cancelled the moment it does); raises the HTTP error of the first choice that failed."""
        if len(self.generations) == 1:
            got = await self.generations[0].collect(watch)
            return None if got is None else [got]
        results = await asyncio.gather(*(g.collect(watch) for g in self.generations), return_exceptions=True)
        for r in results:
            if isinstance(r, BaseException):
                self.cancel()
                raise r
        collected = [r for r in results if r is not None and not isinstance(r, BaseException)]
        return None if len(collected) < len(results) else collected  # a choice's client went away

    async def events(self) -> AsyncIterator[tuple[int, Event]]:
        """(choice index, event) as they come; every choice's `Finished` is among them. If the
        consumer stops early, every choice is cancelled."""
        if len(self.generations) == 1:
            async for ev in self.generations[0].events():
                yield 0, ev
            return
        queue: asyncio.Queue[tuple[int, Event | None]] = asyncio.Queue()

        async def pump(index: int, generation: Generation) -> None:
            try:
                async for ev in generation.events():
                    queue.put_nowait((index, ev))
            finally:
                queue.put_nowait((index, None))

        tasks = [asyncio.create_task(pump(i, g)) for i, g in enumerate(self.generations)]
        open_ = len(tasks)
        try:
            while open_:
                index, got = await queue.get()
                if got is None:
                    open_ -= 1
                    continue
                yield index, got
        finally:
            for t in tasks:
                t.cancel()
            self.cancel()

