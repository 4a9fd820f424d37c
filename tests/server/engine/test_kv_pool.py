"""One unified KV pool shared by every slot (issue 16), on the simulated runner: a slot may
grow past an even share, admission reserves cells, and a full pool frees idle KV first,
then stops the request that grew past its reservation — never a crash."""

from __future__ import annotations

import pytest

from server.engine.engine import Engine
from server.engine.sampling_params import SamplingParams
from server.engine.scheduler import Scheduler
from server.engine.sequence import GenerationRequest
from server.engine.slots import SlotPool
from tests.server.engine.sim_runner import SimRunner
from tests.server.engine.test_scheduler import Collector, run_until_idle


def make_engine(*, n_slots: int, kv_cells: int, capacity: int | None = None, batch: int = 16):
    runner = SimRunner(kv_capacity=capacity if capacity is not None else kv_cells)
    sched = Scheduler(SlotPool(list(range(n_slots))), max_batch_tokens=batch, max_waiting=8, reuse=True,
                      kv_cells=kv_cells)
    return Engine(runner, sched), runner


def req(prompt, max_tokens, reserved=None):
    return GenerationRequest(prompt_tokens=list(prompt), sampling=SamplingParams(temperature=0),
                             max_tokens=max_tokens, ignore_eos=True, reserved_output=reserved)


def test_one_slot_grows_past_an_even_share_while_the_others_idle():
    engine, runner = make_engine(n_slots=4, kv_cells=64)  # an even share would be 16 cells
    c = Collector()
    seq = engine.submit(req(range(10, 40), max_tokens=30), c)
    run_until_idle(engine)
    assert c.final.finish_reason == "length" and c.final.completion_tokens == 30
    assert seq.n_past == 59 and runner.held[seq.slot.seq_id] == 59  # 59 of 64 cells, one slot


def test_requests_whose_reservations_do_not_fit_wait_instead_of_failing():
    engine, runner = make_engine(n_slots=4, kv_cells=40)
    cols = [Collector() for _ in range(4)]
    for i, c in enumerate(cols):
        engine.submit(req(range(10 * i + 3, 10 * i + 13), max_tokens=10), c)
    engine.step()
    assert engine.scheduler.n_running == 2 and engine.scheduler.n_waiting == 2  # 20 cells each: two fit
    assert engine.scheduler.reserved_cells == 40
    run_until_idle(engine)
    assert all(c.final.finish_reason == "length" and c.final.completion_tokens == 10 for c in cols)
    assert engine.stats().n_preempted == 0


def test_a_full_pool_drops_idle_slots_kept_kv_before_anything_else():
    engine, runner = make_engine(n_slots=2, kv_cells=30)
    first = Collector()
    a = engine.submit(req(range(10, 20), max_tokens=5), first)
    run_until_idle(engine)
    assert runner.held[a.slot.seq_id] == 14  # the idle slot keeps its KV (source A)
    second = Collector()
    b = engine.submit(req(range(50, 60), max_tokens=10), second)  # 20 more cells: 34 > 30
    run_until_idle(engine)
    assert b.slot is not a.slot
    assert second.final.finish_reason == "length" and second.final.completion_tokens == 10
    assert runner.reclaimed == [a.slot.seq_id] and a.slot.tokens == []
    assert engine.stats().n_kv_full >= 1 and engine.stats().n_preempted == 0


def test_the_request_past_its_reservation_is_stopped_when_the_pool_is_full():
    engine, runner = make_engine(n_slots=2, kv_cells=30)
    greedy, modest = Collector(), Collector()
    # reserves 5 + 5 cells but may generate 20; the other reserves all it needs (5 + 15)
    g = engine.submit(req(range(10, 15), max_tokens=20, reserved=5), greedy)
    m = engine.submit(req(range(40, 45), max_tokens=15), modest)
    run_until_idle(engine)
    assert modest.final.finish_reason == "length" and modest.final.completion_tokens == 15
    assert greedy.final.finish_reason == "length" and 5 <= greedy.final.completion_tokens < 20
    assert greedy.final.error is None
    assert engine.stats().n_preempted == 1
    assert sum(runner.held.values()) <= 30 and g.status.value == m.status.value == "finished"


def test_a_request_larger_than_the_pool_is_refused_at_submission():
    engine, _ = make_engine(n_slots=2, kv_cells=30)
    with pytest.raises(ValueError, match="KV cells"):
        engine.submit(req(range(10, 30), max_tokens=11), Collector())
