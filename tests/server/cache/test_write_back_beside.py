"""Parked write-backs read beside the compute (server/cache/write_back.py, `beside`): the step that reaches a parked
copy starts its read of what the host lacks (KVOps.extract_beside, here simulated), stores nothing until the read is
done, then stores the copy in one go from it and gives both parked ids back; where no second parked id is free, or
the read fails, the copy goes in pieces or whole from its cells, as before. The real engine's reads are tested in
tests/server/engine/test_staged_state_real.py and tests/server/cache/test_router_real.py."""

from __future__ import annotations

from concurrent.futures import Future
from types import SimpleNamespace

from server.cache.kv_ops import ExtractError
from server.cache.write_back import WriteBackQueue
from tests.server.cache.test_write_back_at_once import FakeRuntime, FakeSeqIds

STEP = 100  # bytes a step; 1 byte a token


class FakeKV:
    stages = True

    def __init__(self, runtime: FakeRuntime):
        self.runtime = runtime
        self.reads: list[tuple[int, int, int, int]] = []  # (src, start, end, hold)
        self.refuse = False
        self.fail = False

    def extract_beside(self, src: int, start: int, end: int, hold: int):
        if self.refuse:
            raise ExtractError("could not snapshot")
        self.runtime.seq_cp(src, hold, start, end)
        self.reads.append((src, start, end, hold))
        read: Future = Future()

        def segment():
            if self.fail:
                raise ExtractError("the read failed")
            return SimpleNamespace(pos0=start, n_tokens=end - start, nbytes=end - start)
        return SimpleNamespace(start=start, end=end, hold_seq=hold, read=read, segment=segment)


def queue(held: int = 0):
    runtime, seq_ids = FakeRuntime(), FakeSeqIds()
    stores: list[tuple[int, int, bool, object]] = []  # (seq, path length, final, ready)

    def store(seq_id, tokens, final, ready, sessions):
        stores.append((seq_id, len(tokens), final, ready))
        return object()
    kv = FakeKV(runtime)
    q = WriteBackQueue(runtime, seq_ids, store, lambda: 1, STEP, kv=kv,  # type: ignore[arg-type]
                       held_depth=lambda tokens: held)
    return q, runtime, seq_ids, kv, stores


def park(q, runtime, n: int) -> None:
    runtime.n[0] = n
    assert q.park(0, list(range(n)))


def test_a_parked_copy_is_read_beside_the_compute_then_stored_whole():
    q, runtime, seq_ids, kv, stores = queue(held=40)  # the host holds its first 40 tokens
    assert q.beside
    park(q, runtime, 500)
    q.advance()
    ((src, start, end, hold),) = kv.reads
    assert (start, end) == (40, 500) and stores == [], "only what the host lacks is read; nothing stored yet"
    q.advance()  # the read still runs: nothing to do
    assert stores == [] and len(kv.reads) == 1
    q.queue[0].reading.read.set_result(b"")
    q.advance()
    ((seq, length, final, ready),) = stores
    assert (length, final, ready.pos0, ready.n_tokens) == (500, True, 40, 460)
    assert not q.queue and sorted(seq_ids.free) == [90, 91], "both parked ids given back"
    assert (q.reads, q.read_bytes, q.read_fallbacks, q.step_pieces, q.dropped) == (1, 460, 0, 0, 0)


def test_without_a_second_parked_id_the_copy_goes_in_pieces():
    q, runtime, seq_ids, kv, stores = queue()
    park(q, runtime, 500)
    seq_ids.free.clear()  # every other parked id in use
    q.advance()
    assert kv.reads == [] and q.read_fallbacks == 1
    assert stores == [(q.queue[0].seq_id, STEP, False, None)] and q.step_pieces == 1


def test_a_refused_or_failed_read_stores_the_copy_from_its_cells():
    q, runtime, seq_ids, kv, stores = queue()
    kv.refuse = True
    park(q, runtime, 500)
    q.advance()
    assert q.read_fallbacks == 1 and stores[0][1:] == (STEP, False, None), "refused: in pieces"
    assert sorted(seq_ids.free) == [91], "the second id given back at once"
    q.drain()
    q, runtime, seq_ids, kv, stores = queue()
    kv.fail = True
    park(q, runtime, 500)
    q.advance()
    q.queue[0].reading.read.set_result(b"")
    q.advance()
    assert stores == [(90, 500, True, None)] and q.read_fallbacks == 1 and sorted(seq_ids.free) == [90, 91]


def test_draining_waits_for_the_read_in_flight():
    q, runtime, seq_ids, kv, stores = queue()
    park(q, runtime, 500)
    q.advance()
    reading = q.queue[0].reading
    reading.read.set_result(b"")  # (done by the time the idle engine drains)
    q.drain()
    assert stores == [(90, 500, True, stores[0][3])] and stores[0][3].n_tokens == 500 and not q.queue


def test_a_read_the_host_no_longer_reaches_back_to_is_started_again_once():
    """The host evicted part of what preceded the read meanwhile: storing from the read would copy the rest from the
    cells on the engine thread, so the read is started again from what the host holds now (once)."""
    held = {"depth": 200}
    q, runtime, seq_ids, kv, stores = queue()
    q.held_depth = lambda tokens: held["depth"]
    park(q, runtime, 500)
    q.advance()
    held["depth"] = 100
    q.queue[0].reading.read.set_result(b"")
    q.advance()
    assert [(s, e) for _, s, e, _ in kv.reads] == [(200, 500), (100, 500)] and stores == []
    held["depth"] = 50  # lost more again: no third read, stored from the second (the store reads the rest)
    q.queue[0].reading.read.set_result(b"")
    q.advance()
    ((_, length, final, ready),) = stores
    assert (length, final, ready.pos0) == (500, True, 100) and len(kv.reads) == 2 and sorted(seq_ids.free) == [90, 91]


def test_a_copy_the_host_would_not_take_is_dropped_before_its_read():
    """Under the predictive policy the host declines a path worth less than what it holds (host_tier.admits): asked
    before the read, such a copy is dropped unread (its cells freed) and the next copy's read starts in the same
    step; a copy it would take is read as before."""
    runtime, seq_ids = FakeRuntime(), FakeSeqIds()
    stores: list = []
    asked: list[tuple[int, tuple[str, ...]]] = []

    def admits(tokens, sessions):
        asked.append((len(tokens), sessions))
        return sessions != ("done",)
    kv = FakeKV(runtime)
    q = WriteBackQueue(runtime, seq_ids, lambda *a: stores.append(a) or object(), lambda: 1, STEP,  # type: ignore
                       kv=kv, held_depth=lambda tokens: 0, admits=admits)  # type: ignore[arg-type]
    runtime.n[0] = 300
    assert q.park(0, list(range(300)), ("done",))
    assert q.park(0, list(range(200)), ("waiting",))
    parked = [c.seq_id for c in q.queue]
    q.advance()
    assert asked == [(300, ("done",)), (200, ("waiting",))]
    assert [(start, end) for _, start, end, _ in kv.reads] == [(0, 200)], "only the copy the host takes is read"
    assert len(q.queue) == 1 and kv.reads[0][3] == parked[0], \
        "the declined copy's parked id was given back (and taken again to hold the next read)"
    assert (q.declined_unread, q.dropped, q.reads) == (1, 1, 1) and stores == []
    q.queue[0].reading.read.set_result(b"")
    q.advance()
    assert len(stores) == 1 and not q.queue and q.stats()["declined_unread"] == 1
