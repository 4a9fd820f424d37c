"""The engine's hand-off to the HTTP server's event loop.

The engine is built with a `LoopDelivery`, so each engine step's events for every stream cross
to the event loop at once (one wake-up of the loop per step, not one per token per stream), and
the generations' sinks (server.api.engine_bridge.generation) run on the loop thread. With a
stream interval (`--stream-interval-ms`) the loop drains on its own timer while tokens come
faster than that, so each stream writes one chunk per interval, not one per token.
"""

from __future__ import annotations

import asyncio
import collections
import ctypes
import os

from server.engine.engine import deliver_inline
from server.engine.sequence import TextDelta


def _gil_holding_write():
    """write(2) called without releasing the GIL (ctypes.PyDLL keeps it; os.write drops it)."""
    try:
        write = ctypes.PyDLL(None).write
    except (OSError, AttributeError):  # no C library symbols in this process: fall back
        return lambda fd: os.write(fd, b"\x01")
    write.argtypes = [ctypes.c_int, ctypes.c_char_p, ctypes.c_size_t]
    write.restype = ctypes.c_ssize_t
    return lambda fd: write(fd, b"\x01", 1)


class LoopDelivery:
    """The engine's `deliver` for the HTTP server: runs each step's sinks on `loop`.

    Why not `loop.call_soon_threadsafe`: its wake-up is a socket send that releases the GIL,
    so the woken event loop takes the GIL and the engine thread waits for it (up to the
    interpreter's 5 ms switch interval) before it can start the next decode. Here the
    engine queues the step's events and wakes the loop with a write that keeps the GIL, so
    the loop runs while the engine's next llama_decode runs (which releases the GIL): HTTP
    work overlaps compute instead of taking turns with it. At most one wake-up is pending.

    `interval_s` > 0 (`--stream-interval-ms`): after a drain that delivered something the loop
    arms a timer of that length and, while it is armed, the engine queues its steps without
    waking the loop; the timer drains them (and re-arms while steps keep coming). So a stream
    that generates faster than one token per interval gets one chunk (one parse of its reply,
    one socket write) per interval instead of one per token: on a small machine the front end's
    CPU per token is what a compute-light model's single stream loses to llama-server
    (docs/benchmark-notes.md). A step that ends a request or brings a stream's first event
    wakes the loop at once (time to first token and the end of a request never wait), and a
    timer that finds nothing queued is not re-armed, so a stream slower than the interval
    gets every token as soon as it is sampled. No event waits longer than the interval.
    """

    def __init__(self, loop: asyncio.AbstractEventLoop, interval_s: float = 0.0):
        if interval_s < 0:
            raise ValueError(f"interval_s must be >= 0, got {interval_s}")
        self._loop = loop
        self._interval = interval_s
        self._steps: collections.deque[list] = collections.deque()
        self._wake_pending = False
        self._timer: asyncio.TimerHandle | None = None  # loop thread only
        self._timer_armed = False  # set by the loop thread, read by the engine thread
        self._started: set[int] = set()  # ids of sinks that had an event and no Finished yet (engine thread)
        self._rfd, self._wfd = os.pipe()
        os.set_blocking(self._rfd, False)
        os.set_blocking(self._wfd, False)
        self._wake = _gil_holding_write()
        loop.add_reader(self._rfd, self._on_wake)

    def __call__(self, events: list) -> None:  # engine thread
        self._steps.append(events)
        # Ordering with the timer (both threads hold the GIL for these lines): the timer clears
        # _timer_armed before it drains, so a step that saw it armed was queued before the drain.
        held = self._interval > 0 and not self._urgent(events) and self._timer_armed
        if self._wake_pending or held:
            return
        self._wake_pending = True
        self._wake(self._wfd)

    def _urgent(self, events: list) -> bool:
        """Whether `events` hold something no timer may delay: a sink's first event, or any event
        but text (a request's end). Keeps `_started` (the sinks that had their first event)."""
        urgent = False
        for sink, event in events:
            key = id(sink)
            if not isinstance(event, TextDelta):
                urgent = True
                self._started.discard(key)
            elif key not in self._started:
                urgent = True
                self._started.add(key)
        return urgent

    def _on_wake(self) -> None:  # event loop: the engine wrote to the pipe
        try:
            os.read(self._rfd, 4096)
        except BlockingIOError:
            pass
        self._wake_pending = False  # before draining: a step queued after this wakes us again
        self._drain()

    def _on_timer(self) -> None:  # event loop
        self._timer = None
        self._timer_armed = False  # before draining: see __call__
        self._drain()

    def _drain(self) -> None:
        delivered = bool(self._steps)
        while self._steps:
            deliver_inline(self._steps.popleft())
        if delivered and self._interval > 0 and self._timer is None:
            self._timer = self._loop.call_later(self._interval, self._on_timer)
            self._timer_armed = True

    def close(self) -> None:
        """After the engine stopped: deliver what is left, release the pipe."""
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        self._timer_armed = False
        self._interval = 0.0  # nothing left to hold for
        self._on_wake()
        self._loop.remove_reader(self._rfd)
        os.close(self._rfd)
        os.close(self._wfd)
