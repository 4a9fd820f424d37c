"""The engine-to-event-loop hand-off and the per-stream SSE frames (no model)."""

from __future__ import annotations

import asyncio
import threading

from server.api import responses as R
from server.api.generation import LoopDelivery, coalesce
from server.engine.sequence import CacheReport, Finished, TextDelta

FIN = Finished("stop", 3, 0, 2, 1.0, 1.0, CacheReport())


def test_coalesce_joins_runs_of_text_only():
    events = [TextDelta("a", (1,)), TextDelta("b", (2,)), FIN, TextDelta("c", (3,))]
    assert coalesce(events) == [TextDelta("ab", (1, 2)), FIN, TextDelta("c", (3,))]
    assert coalesce([]) == []


async def test_loop_delivery_runs_every_step_in_order_on_the_loop_thread():
    loop = asyncio.get_running_loop()
    delivery = LoopDelivery(loop)
    seen: list[tuple[int, int]] = []
    threads: set[int] = set()
    done = asyncio.Event()

    def sink(event):
        threads.add(threading.get_ident())
        seen.append(event)
        if event == (99, 0):
            done.set()

    def engine():  # many steps from another thread, faster than the loop drains them
        for step in range(100):
            delivery([(sink, (step, 0)), (sink, (step, 1))])

    worker = threading.Thread(target=engine)
    worker.start()
    await asyncio.wait_for(done.wait(), 30)
    worker.join()
    assert seen == [(s, i) for s in range(100) for i in (0, 1)]
    assert threads == {threading.get_ident()}
    delivery([(sink, "late")])  # left for close() to deliver
    delivery.close()
    assert seen[-1] == "late"


def test_sse_with_text_frames_equal_full_serialization():
    served = R.ServedModel('model "x"', "fp_0123")
    frame = R.sse_with_text(R.chat_chunk("id-1", served, 7, {"content": R.TEXT_SLOT}))
    for text in ["hello", 'quote " and \\ backslash', "line\nbreak", "\x00", "héllo ☃", ""]:
        assert frame(text) == R.sse(R.chat_chunk("id-1", served, 7, {"content": text}))
