"""The engine loop and scheduler on a simulated runner: order, chunking, cancellation,
queue limits, slot reuse, stop conditions."""

from __future__ import annotations

import threading

import pytest

from server.engine.engine import Engine
from server.engine.sampling_params import SamplingParams
from server.engine.scheduler import QueueFull, Scheduler
from server.engine.sequence import Finished, GenerationRequest, TextDelta
from server.engine.slots import SlotPool
from tests.server.engine.sim_runner import EOG, SimRunner


def make_engine(n_slots=2, batch=16, max_waiting=8, reuse=True, script=None):
    runner = SimRunner(script=script, reuse=reuse)
    sched = Scheduler(SlotPool(list(range(n_slots))), max_batch_tokens=batch, max_waiting=max_waiting, reuse=reuse)
    return Engine(runner, sched), runner


class Collector:
    def __init__(self):
        self.events: list = []

    def __call__(self, ev):
        self.events.append(ev)

    @property
    def text(self) -> str:
        return "".join(e.text for e in self.events if isinstance(e, TextDelta))

    @property
    def final(self) -> Finished | None:
        return next((e for e in self.events if isinstance(e, Finished)), None)


def req(prompt, max_tokens=4, stop=()):
    return GenerationRequest(prompt_tokens=list(prompt), sampling=SamplingParams(temperature=0),
                             max_tokens=max_tokens, stop=list(stop))


def run_until_idle(engine, limit=500):
    for _ in range(limit):
        if not engine.step() and not engine.scheduler.waiting:
            return
    raise AssertionError("engine did not go idle")


def test_long_prefill_is_chunked_and_decoding_continues_every_step():
    engine, runner = make_engine(n_slots=2, batch=8)
    a, b = Collector(), Collector()
    sa = engine.submit(req(range(10, 13), max_tokens=20), a)  # short: decodes while b prefills
    engine.step()  # a prefills fully and samples its first token
    sb = engine.submit(req(range(20, 50), max_tokens=2), b)  # 30 prompt tokens > batch 8
    run_until_idle(engine)
    assert b.final.finish_reason == "length" and a.final.finish_reason == "length"
    b_chunks = [(n, pos) for step in runner.steps for (sid, n, pos, _) in step if sid == sb.id]
    # b's prompt went in chunks that never exceed what the batch left after a's decode token
    assert sum(n for n, _ in b_chunks[:-2]) >= 28
    for step in runner.steps:
        assert sum(n for (_, n, _, _) in step) <= 8
        ids = [sid for (sid, *_rest) in step]
        if sb.id in ids and any(sid == sa.id for sid in ids):
            assert (sa.id, 1) in [(sid, n) for (sid, n, _, _) in step]  # a kept decoding, one token per step
    prefill_steps = [step for step in runner.steps if any(sid == sb.id and not smp for (sid, _, _, smp) in step)]
    assert len(prefill_steps) >= 3, "a 30-token prompt with an 8-token batch takes several steps"


def test_prefill_while_decoding_caps_prompt_chunks_only_while_someone_decodes():
    runner = SimRunner()
    sched = Scheduler(SlotPool([0, 1]), max_batch_tokens=16, max_waiting=8, reuse=True, prefill_while_decoding=4)
    engine = Engine(runner, sched)
    first = engine.submit(req(range(200, 240), max_tokens=1), Collector())  # 40 tokens, nobody decodes
    engine.step()
    assert [n for (sid, n, _, _) in runner.steps[0] if sid == first.id] == [16]  # alone: the whole batch
    run_until_idle(engine)
    a, b = Collector(), Collector()
    sa = engine.submit(req(range(10, 13), max_tokens=30), a)  # short: decodes while b prefills
    engine.step()
    sb = engine.submit(req(range(100, 140), max_tokens=2), b)
    start = len(runner.steps)
    run_until_idle(engine)
    assert b.final.finish_reason == "length" and a.final.finish_reason == "length"
    chunks = [sum(n for (sid, n, _, _) in step if sid == sb.id) for step in runner.steps[start:]
              if any(sid == sa.id for (sid, *_rest) in step)
              and any(sid == sb.id and not smp for (sid, _, _, smp) in step)]
    assert chunks and max(chunks) <= 4, chunks  # while a decodes, b's prompt goes 4 tokens a step
    assert sum(chunks) >= 36


def test_fifo_admission_and_waiting_when_slots_are_busy():
    engine, runner = make_engine(n_slots=1, batch=16)
    c1, c2 = Collector(), Collector()
    s1 = engine.submit(req([1, 3, 4], max_tokens=3), c1)
    s2 = engine.submit(req([5, 6, 7], max_tokens=3), c2)
    engine.step()
    assert engine.scheduler.n_waiting == 1 and s2.slot is None
    run_until_idle(engine)
    first_s2_step = next(i for i, st in enumerate(runner.steps) if any(sid == s2.id for (sid, *_r) in st))
    last_s1_step = max(i for i, st in enumerate(runner.steps) if any(sid == s1.id for (sid, *_r) in st))
    assert first_s2_step > last_s1_step
    assert c1.final.completion_tokens == 3 and c2.final.completion_tokens == 3


def test_queue_limit_raises_queue_full():
    engine, _ = make_engine(n_slots=1, max_waiting=1)
    engine.submit(req([1, 3]), Collector())
    with pytest.raises(QueueFull):
        engine.submit(req([1, 4]), Collector())


def test_cancel_running_request_frees_slot_and_keeps_computed_kv():
    engine, runner = make_engine(n_slots=1, batch=4)
    c = Collector()
    s = engine.submit(req(range(30, 40), max_tokens=50), c)
    engine.step()  # first chunk of 4
    engine.cancel(s)
    engine.step()
    assert c.final.finish_reason == "cancelled"
    slot = engine.scheduler.slots.slots[0]
    assert not slot.busy and slot.tokens == list(range(30, 34))
    assert (s.id, "cancelled") in runner.released


def test_cancel_waiting_request_never_runs():
    engine, runner = make_engine(n_slots=1)
    c1, c2 = Collector(), Collector()
    engine.submit(req([1, 3], max_tokens=2), c1)
    s2 = engine.submit(req([1, 4], max_tokens=2), c2)
    engine.cancel(s2)
    run_until_idle(engine)
    assert c2.final.finish_reason == "cancelled" and c2.final.completion_tokens == 0
    assert all(sid != s2.id for st in runner.steps for (sid, *_r) in st)


def test_idle_slot_with_longest_common_prefix_is_chosen():
    engine, _ = make_engine(n_slots=2)
    for prompt in ([1, 2, 3, 4, 5], [9, 9, 9, 9, 9]):
        engine.submit(req(prompt, max_tokens=1), Collector())
        run_until_idle(engine)
    c = Collector()
    s = engine.submit(req([9, 9, 9, 9, 7, 7], max_tokens=1), c)
    run_until_idle(engine)
    assert s.slot.tokens[:4] == [9, 9, 9, 9]
    assert c.final.cached_tokens == 4 and c.final.cache.source == "A"


def test_reuse_off_computes_everything():
    engine, _ = make_engine(n_slots=1, reuse=False)
    engine.submit(req([1, 2, 3, 4], max_tokens=1), Collector())
    run_until_idle(engine)
    c = Collector()
    engine.submit(req([1, 2, 3, 4, 5], max_tokens=1), c)
    run_until_idle(engine)
    assert c.final.cached_tokens == 0 and c.final.cache.source == "none"


def test_fully_cached_prompt_still_computes_its_last_token():
    engine, runner = make_engine(n_slots=1)
    engine.submit(req([1, 2, 3, 4], max_tokens=1), Collector())
    run_until_idle(engine)
    c = Collector()
    s = engine.submit(req([1, 2, 3, 4], max_tokens=1), c)
    run_until_idle(engine)
    assert c.final.cached_tokens == 3
    assert [(n, pos) for st in runner.steps for (sid, n, pos, _) in st if sid == s.id] == [(1, 3)]


def test_stop_string_across_tokens_is_never_streamed():
    # pieces are "<id>": a stop string "1><12" spans the tokens 11 and 12
    engine, _ = make_engine(script=None)
    c = Collector()
    s = engine.submit(req([5], max_tokens=10, stop=["1><12"]), c)
    engine.runner.script[s.id] = [10, 11, 12, 13]
    run_until_idle(engine)
    assert c.final.finish_reason == "stop" and c.final.stop_word == "1><12"
    assert c.text == "<10><1"
    assert "12" not in c.text


def test_eog_stops_and_is_not_emitted():
    engine, _ = make_engine()
    c = Collector()
    s = engine.submit(req([5], max_tokens=10), c)
    engine.runner.script[s.id] = [7, EOG, 8]
    run_until_idle(engine)
    assert c.final.finish_reason == "stop" and c.text == "<7>" and c.final.completion_tokens == 1


def test_engine_thread_serves_submissions_from_other_threads():
    engine, _ = make_engine(n_slots=2)
    engine.start()
    try:
        done = [threading.Event() for _ in range(3)]
        collectors = []
        for i in range(3):
            c = Collector()
            collectors.append(c)

            def sink(ev, c=c, d=done[i]):
                c(ev)
                if isinstance(ev, Finished):
                    d.set()

            engine.submit(req([1, i + 3], max_tokens=3), sink)
        assert all(d.wait(10) for d in done)
        assert all(c.final.completion_tokens == 3 for c in collectors)
    finally:
        engine.stop()


def test_a_failing_prepare_fails_only_that_request():
    engine, runner = make_engine(n_slots=2)

    def boom(adm):
        raise RuntimeError("restore failed")

    runner.prepare = boom
    c = Collector()
    engine.submit(req([1, 2, 3]), c)
    run_until_idle(engine)
    assert c.final.finish_reason == "error" and "restore failed" in c.final.error
    assert engine.scheduler.slots.n_busy() == 0


def test_deferred_request_waits_while_later_ones_are_admitted():
    engine, runner = make_engine(n_slots=2)
    held = set()
    engine.scheduler.defer = lambda seq: seq.id in held
    c1, c2 = Collector(), Collector()
    s1 = engine.submit(req([1, 2, 3], max_tokens=2), c1)
    held.add(s1.id)
    s2 = engine.submit(req([4, 5, 6], max_tokens=2), c2)
    engine.step()
    assert s1.slot is None and s2.slot is not None
    held.clear()
    run_until_idle(engine)
    assert c1.final.completion_tokens == 2 and c2.final.completion_tokens == 2
