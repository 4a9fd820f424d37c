"""The engine-to-event-loop hand-off, with and without a stream interval (no model)."""

from __future__ import annotations

import asyncio
import threading
import time

import pytest

from server.api.engine_bridge.loop_delivery import LoopDelivery
from server.engine.sequence import CacheReport, Finished, TextDelta

FIN = Finished("stop", 3, 0, 2, 1.0, 1.0, CacheReport())


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


async def _on_engine_thread(fn):
    """Run fn() on a thread of its own, as the engine calls the delivery."""
    await asyncio.to_thread(fn)


async def test_a_stream_interval_holds_text_until_the_timer_and_never_a_first_event_or_an_end():
    loop = asyncio.get_running_loop()
    delivery = LoopDelivery(loop, interval_s=30.0)  # a timer that cannot fire during the test
    seen: list = []
    first_seen = threading.Event()

    def sink(event):
        seen.append(event)
        first_seen.set()

    def other(event):
        seen.append(("other", event))

    held_before_end: list[int] = []

    def engine():
        delivery([(sink, TextDelta("a", (1,)))])  # a first event: at once
        assert first_seen.wait(10)
        for i in range(20):
            delivery([(sink, TextDelta("b", (i,)))])  # held: the timer is armed
        delivery([(other, TextDelta("o", (7,)))])  # another stream's first event: at once, with the held ones
        time.sleep(0.2)
        held_before_end.append(len(seen))
        delivery([(sink, TextDelta("c", (2,)))])  # held again
        time.sleep(0.2)
        held_before_end.append(len(seen))
        delivery([(sink, FIN)])  # an end: at once, with what was held

    await _on_engine_thread(engine)
    for _ in range(200):
        if seen and seen[-1] == FIN:
            break
        await asyncio.sleep(0.01)
    assert held_before_end == [22, 22], seen  # "a", the 20 "b", the other stream's "o"; "c" waits
    assert seen == [TextDelta("a", (1,)), *[TextDelta("b", (i,)) for i in range(20)],
                    ("other", TextDelta("o", (7,))), TextDelta("c", (2,)), FIN]
    delivery.close()


async def test_the_stream_interval_timer_delivers_held_text_without_an_end():
    loop = asyncio.get_running_loop()
    delivery = LoopDelivery(loop, interval_s=0.05)
    seen: list = []
    first_seen = threading.Event()

    def sink(event):
        seen.append(event)
        first_seen.set()

    def engine():
        delivery([(sink, TextDelta("a", (1,)))])
        assert first_seen.wait(10)
        for i in range(5):
            delivery([(sink, TextDelta("b", (i,)))])

    await _on_engine_thread(engine)
    for _ in range(500):  # the timer drains them: no end, no other wake-up comes
        if len(seen) == 6:
            break
        await asyncio.sleep(0.01)
    assert seen == [TextDelta("a", (1,)), *[TextDelta("b", (i,)) for i in range(5)]]
    await asyncio.sleep(0.2)  # a timer that found nothing queued is not re-armed ...
    delivery([(sink, FIN)])  # ... and an end still comes at once
    for _ in range(500):
        if seen[-1] == FIN:
            break
        await asyncio.sleep(0.01)
    assert seen[-1] == FIN
    delivery.close()


def test_a_negative_stream_interval_is_refused():
    loop = asyncio.new_event_loop()
    try:
        with pytest.raises(ValueError, match="interval_s"):
            LoopDelivery(loop, interval_s=-1)
    finally:
        loop.close()
