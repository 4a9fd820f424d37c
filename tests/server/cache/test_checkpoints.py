"""State checkpoints (server/cache/checkpoints.py) and tier A on models that need them
(server/cache/checkpointed_slots.py), over a simulated llama.cpp memory: which cuts are exact,
which need a checkpoint, and that a slot never resumes from a state it does not have."""

from __future__ import annotations

import threading
from types import SimpleNamespace

import pytest

from server.cache.checkpointed_slots import CheckpointedSlotReuse
from server.cache.checkpoints import ModelMemory, SlotCheckpoints, StateCheckpoint, stops, turn_starts
from server.engine.sampling_params import SamplingParams
from server.engine.scheduler import Scheduler
from server.engine.sequence import GenerationRequest, SeqStatus, Sequence
from server.engine.slots import Slot, SlotPool

SWA = ModelMemory("gemma3", n_swa=8, recurrent=False)
RECURRENT = ModelMemory("lfm2", n_swa=0, recurrent=True)


class SimMemory:
    """One sequence per slot: the full-attention KV is a list of positions, the window layers keep
    a suffix of it from `swa_min`, the recurrent state sits at `state_pos` (the tokens it follows)."""

    def __init__(self, memory: ModelMemory):
        self.memory = memory
        self.seqs: dict[int, dict] = {}
        self.partial_sets: list[tuple[int, int]] = []

    def fill(self, sid: int, n: int) -> None:
        """The sequence computed n tokens from scratch (the window layers pruned what they can)."""
        self.seqs[sid] = {"n": n, "swa_min": max(0, n - self.memory.n_swa - 4) if self.memory.n_swa else 0,
                          "state_pos": n}

    @staticmethod
    def is_control(token: int) -> bool:
        return token < 10  # the simulated template's turn markers

    def seq_pos_min(self, sid: int) -> int:
        s = self.seqs.get(sid)
        return -1 if not s or s["n"] == 0 else s["swa_min"]

    def seq_pos_max(self, sid: int) -> int:
        s = self.seqs.get(sid)
        return -1 if not s else s["n"] - 1

    def seq_rm(self, sid: int, p0: int = -1, p1: int = -1) -> bool:
        s = self.seqs.setdefault(sid, {"n": 0, "swa_min": 0, "state_pos": 0})
        if p0 <= 0:
            s.update(n=0, swa_min=0, state_pos=0)
            return True
        if self.memory.recurrent and p0 < s["state_pos"]:
            return False  # llama.cpp refuses to cut a recurrent state back
        s["n"] = min(s["n"], p0)
        return True

    def state_seq_get(self, sid: int, *, partial: bool = False) -> bytes:
        assert partial
        s = self.seqs[sid]
        return f"{sid}:{s['n']}".encode()

    def state_seq_set(self, blob: bytes, sid: int, *, partial: bool = False) -> bool:
        assert partial
        pos = int(blob.decode().split(":")[1])
        s = self.seqs[sid]
        s.update(swa_min=max(0, pos - self.memory.n_swa), state_pos=pos)
        self.partial_sets.append((sid, pos))
        return True


def admission(prompt: list[int], slot: Slot, common: int):
    seq = Sequence(GenerationRequest(prompt_tokens=prompt, sampling=SamplingParams(temperature=0), max_tokens=4),
                   lambda ev: None)
    seq.slot = slot
    return SimpleNamespace(seq=seq, slot=slot, common_prefix=common)


def test_stops_every_n_and_before_the_last_prompt_token():
    assert stops(100, 0, 32) == (32, 64, 96, 99)
    assert stops(100, 40, 32) == (64, 96, 99)
    assert stops(100, 0, 0) == (99,)
    assert stops(1, 0, 32) == ()
    assert stops(64, 0, 32) == (32, 63)


def test_slot_checkpoints_keep_the_newest_below_a_prefix_and_forget_past_a_cut():
    c = SlotCheckpoints(limit=3)
    for p in (10, 20, 30, 40):
        c.add(StateCheckpoint(p, b"x" * p))
    assert c.positions() == [20, 30, 40]  # the oldest went beyond the limit
    assert c.newest_at_or_below(35).pos == 30 and c.newest_at_or_below(19) is None
    c.forget_after(30)
    assert c.positions() == [20, 30] and c.nbytes == 50


def test_can_cut_swa_only_while_the_window_before_the_cut_is_held():
    mem = SimMemory(SWA)
    mem.fill(0, 100)  # the window layers hold positions 88..99
    assert SWA.can_cut(mem, 0, 100, 100)  # the whole sequence: nothing to cut
    assert SWA.can_cut(mem, 0, 96, 100)  # the window before 96 is 88..95: held
    assert not SWA.can_cut(mem, 0, 90, 100)  # it would need 82..89
    assert not SWA.can_cut(mem, 0, 0, 100) and not SWA.can_cut(mem, 0, 101, 100)


def test_can_cut_recurrent_only_at_the_end():
    mem = SimMemory(RECURRENT)
    mem.fill(0, 50)
    assert RECURRENT.can_cut(mem, 0, 50, 50)
    assert not RECURRENT.can_cut(mem, 0, 49, 50)
    assert ModelMemory("llama", 0, False).needs_checkpoints is False
    assert "sliding-window attention (n_swa=8)" in SWA.describe()


@pytest.mark.parametrize("memory", [SWA, RECURRENT], ids=["swa", "recurrent"])
def test_a_slot_resumes_from_its_newest_checkpoint_at_or_below_the_shared_prefix(memory):
    mem = SimMemory(memory)
    provider = CheckpointedSlotReuse(mem, memory, reuse=True, per_slot=8, every=32)  # type: ignore[arg-type]
    slot = Slot(index=0, seq_id=5)
    first = list(range(1000, 1100))
    adm = admission(first, slot, 0)
    assert provider.provide(adm).reused_tokens == 0
    assert adm.seq.prefill_stops == (32, 64, 96, 99)
    for pos in adm.seq.prefill_stops:  # the engine ran chunks ending there and called back
        mem.fill(5, pos)
        provider.checkpoint(adm.seq, pos)
    mem.fill(5, 103)  # prompt + generated tokens
    slot.tokens = first + [7, 8, 9]

    # a branch sharing 70 tokens: the state at 70 is gone, the checkpoint at 64 is the newest below
    second = first[:70] + list(range(2000, 2050))
    adm = admission(second, slot, 70)
    report = provider.provide(adm)
    assert (report.source, report.reused_tokens) == ("A", 64)
    assert mem.partial_sets[-1] == (5, 64) and mem.seqs[5]["n"] == 64
    assert provider.states.reused_by_checkpoint == 1
    assert provider.states.of(slot).positions() == [32, 64]  # 96 and 99 were on the other branch
    assert adm.seq.prefill_stops == (70, 96, 119)  # 70: where it left the slot's path (a branch point)


def test_without_a_checkpoint_the_slot_is_cleared_and_the_prompt_computed():
    mem = SimMemory(RECURRENT)
    provider = CheckpointedSlotReuse(mem, RECURRENT, reuse=True, per_slot=0, every=32)  # type: ignore[arg-type]
    slot = Slot(index=0, seq_id=1, tokens=list(range(60)))
    mem.fill(1, 60)
    adm = admission(list(range(40)) + [99] * 10, slot, 40)
    report = provider.provide(adm)
    assert report.reused_tokens == 0 and mem.seqs[1]["n"] == 0
    assert provider.states.recomputed == 1 and adm.seq.prefill_stops == ()  # per_slot 0: no checkpoints


def test_a_continuation_cuts_back_without_a_checkpoint():
    mem = SimMemory(RECURRENT)
    provider = CheckpointedSlotReuse(mem, RECURRENT, reuse=True, per_slot=8, every=0)  # type: ignore[arg-type]
    slot = Slot(index=0, seq_id=1, tokens=list(range(60)))
    mem.fill(1, 60)
    adm = admission(list(range(60)) + [5, 6, 7], slot, 60)
    assert provider.provide(adm).reused_tokens == 60
    assert provider.states.reused_by_cut == 1 and not mem.partial_sets


def test_scheduler_ends_prompt_chunks_at_the_prefill_stops():
    sched = Scheduler(SlotPool([0]), max_batch_tokens=64, max_waiting=4, reuse=True)
    seq = Sequence(GenerationRequest(prompt_tokens=list(range(100)), sampling=SamplingParams(), max_tokens=2),
                   lambda ev: None)
    seq.status, seq.prefill_stops = SeqStatus.PREFILLING, (32, 99)
    sched.running.append(seq)
    chunks = []
    while seq.status is SeqStatus.PREFILLING:
        items = sched.plan()
        chunks.append((items[0].start_pos, len(items[0].tokens)))
        sched.commit(items)
    assert chunks == [(0, 32), (32, 64), (96, 3), (99, 1)]


def test_checkpoint_store_finds_the_longest_prefix_it_holds_and_only_for_the_same_tokens():
    from server.cache.checkpoint_store import CheckpointStore

    store = CheckpointStore(budget_bytes=100)
    path = list(range(50))
    assert store.put(path, StateCheckpoint(10, b"a" * 20)) and store.put(path, StateCheckpoint(30, b"b" * 20))
    other = list(range(20)) + [999] * 30  # leaves the path at 20
    assert store.best(path + [7], 49).pos == 30
    assert store.best(path, 29).pos == 10
    assert store.best(other, 49).pos == 10  # the checkpoint at 30 followed other tokens
    assert store.best([5] * 50, 49) is None
    with pytest.raises(ValueError):
        store.put(path, StateCheckpoint(51, b"x"))


def test_checkpoint_store_evicts_the_least_recently_used_beyond_its_budget():
    from server.cache.checkpoint_store import CheckpointStore

    store = CheckpointStore(budget_bytes=50)
    path = list(range(100))
    for pos in (10, 20, 30):
        store.put(path, StateCheckpoint(pos, b"x" * 20))
    assert len(store) == 2 and store.evictions == 1 and store.bytes == 40
    assert store.best(path, 15) is None  # 10 went first
    store.best(path, 25)  # refreshes 20
    store.put(path, StateCheckpoint(40, b"y" * 20))
    assert store.best(path, 35).pos == 20  # 30 was the least recently used
    assert not store.put(path, StateCheckpoint(50, b"z" * 51)) and store.declined == 1
    store.put(path, StateCheckpoint(20, b"w" * 5))  # a newer one for the same prefix replaces it
    assert store.best(path, 25).blob == b"w" * 5 and store.bytes == 25
    assert store.clear() == 25 and len(store) == 0


def test_turn_starts_are_read_from_the_templates_control_tokens():
    # <start>system ... <end>\n<start>user ... <end>\n<start>assistant  (markers 1 and 2, newline 50)
    def turn(role, n, start):
        return [1, role] + list(range(start, start + n)) + [2, 50]

    prompt = turn(100, 30, 200) + turn(101, 10, 300) + turn(102, 8, 400) + turn(101, 12, 500) + [1, 102]
    starts = turn_starts(prompt, lambda t: t < 10, keep_last=2)
    ends = [i for i, t in enumerate(prompt) if t == 2]
    assert starts == (ends[0], ends[-2], ends[-1])  # the system prompt's end, then the last two turns
    assert turn_starts([1, 2, 3], lambda t: t < 10) == ()


def test_checkpoints_on_disk_come_back_after_a_restart_and_only_for_their_model(tmp_path):
    from server.cache.checkpoint_files import CheckpointFiles
    from server.cache.checkpoint_store import CheckpointStore

    path = list(range(100))
    store = CheckpointStore(budget_bytes=1000, files=CheckpointFiles(tmp_path, "model-a", budget_bytes=10_000))
    store.put(path, StateCheckpoint(40, b"x" * 50))
    store.put(path, StateCheckpoint(80, b"y" * 50))
    store.flush_writes()  # the writer thread wrote them

    again = CheckpointStore(budget_bytes=1000, files=CheckpointFiles(tmp_path, "model-a", budget_bytes=10_000))
    assert len(again) == 0  # nothing read until asked for
    found = again.best(path, 99)
    assert found is not None and (found.pos, found.blob) == (80, b"y" * 50) and again.disk_hits == 1
    assert again.best(path, 79).blob == b"x" * 50
    assert again.best(list(range(50)) + [7] * 50, 99).pos == 40  # only the prefix it followed

    other = CheckpointStore(budget_bytes=1000, files=CheckpointFiles(tmp_path, "model-b", budget_bytes=10_000))
    assert other.best(path, 99) is None  # another model's files are not read

    # a damaged file is dropped, not used
    damaged = next(tmp_path.glob("*.ckpt"))
    damaged.write_bytes(damaged.read_bytes()[:-3] + b"zzz")
    fresh = CheckpointStore(budget_bytes=1000, files=CheckpointFiles(tmp_path, "model-a", budget_bytes=10_000))
    got = [fresh.best(path, 99), fresh.best(path, 79)]
    assert all(c is None or not c.blob.endswith(b"zzz") for c in got) and not damaged.exists()
    assert fresh.files is not None and fresh.files.dropped == 1


def test_checkpoint_files_keep_to_their_budget_oldest_first(tmp_path):
    from server.cache.checkpoint_files import CheckpointFiles

    files = CheckpointFiles(tmp_path, "m", budget_bytes=400)
    for i in range(5):
        files.write(bytes([i]) * 16, StateCheckpoint(10 + i, b"z" * 100))
    files.wait_idle()
    assert files.stats()["bytes"] <= 400 and files.dropped >= 1
    assert files.read(bytes([0]) * 16) is None and files.read(bytes([4]) * 16).pos == 14


class WriterGate:
    """Holds a CheckpointFiles' writer thread inside its file write until `release()`."""

    def __init__(self, files, monkeypatch):
        from server.cache.checkpoint_files import CheckpointFiles

        self.entered, self._open = threading.Event(), threading.Event()
        real = getattr(CheckpointFiles, "_write_tmp", None)  # what the writer thread calls to write a file

        def blocked(tmp, head, blob):
            self.entered.set()
            assert self._open.wait(10), "the gate was never released"
            real(tmp, head, blob)

        monkeypatch.setattr(files, "_write_tmp", blocked, raising=False)

    def release(self) -> None:
        self._open.set()


def test_a_checkpoint_put_returns_while_its_disk_write_is_still_blocked(tmp_path, monkeypatch):
    """The engine thread only queues the file write (it used to write and sync it itself)."""
    from server.cache.checkpoint_files import CheckpointFiles
    from server.cache.checkpoint_store import CheckpointStore

    files = CheckpointFiles(tmp_path, "m", budget_bytes=10_000)
    gate = WriterGate(files, monkeypatch)
    store = CheckpointStore(budget_bytes=1000, files=files)
    path = list(range(100))
    returned = threading.Event()
    threading.Thread(target=lambda: (store.put(path, StateCheckpoint(40, b"x" * 50)), returned.set()),
                     daemon=True).start()
    assert returned.wait(5) and gate.entered.wait(5)  # put is back while the writer is stuck in the write
    assert not list(tmp_path.glob("*.ckpt"))
    disk = store.stats()["disk"]
    assert (disk["pending_writes"], disk["pending_bytes"], disk["files"]) == (1, 50, 0)
    gate.release()
    store.flush_writes()
    assert len(list(tmp_path.glob("*.ckpt"))) == 1 and not list(tmp_path.glob("*.tmp"))
    disk = store.stats()["disk"]
    assert (disk["pending_writes"], disk["pending_bytes"], disk["files"]) == (0, 0, 1)
    store.close()


def test_a_checkpoint_still_queued_for_disk_is_found(tmp_path, monkeypatch):
    """Evicted from RAM while its file is not written yet: a lookup gets it from the queue."""
    from server.cache.checkpoint_files import CheckpointFiles
    from server.cache.checkpoint_store import CheckpointStore

    files = CheckpointFiles(tmp_path, "m", budget_bytes=10_000)
    gate = WriterGate(files, monkeypatch)
    store = CheckpointStore(budget_bytes=60, files=files)  # room for one in RAM
    path = list(range(100))
    store.put(path, StateCheckpoint(40, b"x" * 50))
    store.put(path, StateCheckpoint(80, b"y" * 50))  # evicts 40 from RAM
    assert gate.entered.wait(5) and store.evictions == 1 and not list(tmp_path.glob("*.ckpt"))
    found = store.best(path, 79)
    assert found is not None and (found.pos, found.blob) == (40, b"x" * 50)
    assert store.disk_hits == 1 and files.queued_reads == 1
    gate.release()
    store.close()  # writes what is queued
    again = CheckpointStore(budget_bytes=1000, files=CheckpointFiles(tmp_path, "m", budget_bytes=10_000))
    assert again.best(path, 99).blob == b"y" * 50 and again.best(path, 79).blob == b"x" * 50


def test_a_full_checkpoint_queue_drops_the_disk_write_and_keeps_the_ram_copy(tmp_path, monkeypatch):
    from server.cache.checkpoint_files import CheckpointFiles
    from server.cache.checkpoint_store import CheckpointStore

    files = CheckpointFiles(tmp_path, "m", budget_bytes=10_000, queue_bytes=100)
    gate = WriterGate(files, monkeypatch)
    store = CheckpointStore(budget_bytes=1000, files=files)
    path = list(range(100))
    for pos in (20, 40, 60):  # 50 bytes each: the third finds 100 queued
        store.put(path, StateCheckpoint(pos, b"x" * 50))
    disk = store.stats()["disk"]
    assert (disk["dropped_writes"], disk["pending_writes"], disk["pending_bytes"]) == (1, 2, 100)
    assert store.best(path, 99).pos == 60 and store.disk_hits == 0  # from RAM
    gate.release()
    store.flush_writes()
    assert len(list(tmp_path.glob("*.ckpt"))) == 2
    again = CheckpointStore(budget_bytes=1000, files=CheckpointFiles(tmp_path, "m", budget_bytes=10_000))
    assert again.best(path, 99).pos == 40  # 60 never reached the disk
    store.close()


def test_a_checkpoint_deleted_or_replaced_while_queued_never_comes_back_as_a_file(tmp_path, monkeypatch):
    from server.cache.checkpoint_files import CheckpointFiles

    files = CheckpointFiles(tmp_path, "m", budget_bytes=10_000)
    gate = WriterGate(files, monkeypatch)
    d1, d2, d3 = (bytes([i]) * 16 for i in (1, 2, 3))
    assert files.write(d1, StateCheckpoint(10, b"a" * 50))
    assert gate.entered.wait(5)  # d1 is being written
    assert files.write(d2, StateCheckpoint(20, b"b" * 50)) and files.write(d3, StateCheckpoint(30, b"c" * 50))
    assert files.write(d3, StateCheckpoint(30, b"C" * 50))  # a newer one for the same prefix
    files.discard(d1)  # in the middle of its write
    files.discard(d2)  # still queued
    assert files.read(d1) is None and files.read(d2) is None and files.read(d3).blob == b"C" * 50
    gate.release()
    files.wait_idle()
    assert [d for d, _ in files.index()] == [d3] and files.read(d3).blob == b"C" * 50
    assert not list(tmp_path.glob("*.tmp")) and files.stats()["pending_writes"] == 0
    files.close()


def test_closing_checkpoint_files_writes_what_is_queued_then_refuses(tmp_path, monkeypatch):
    from server.cache.checkpoint_files import CheckpointFiles

    files = CheckpointFiles(tmp_path, "m", budget_bytes=10_000)
    gate = WriterGate(files, monkeypatch)
    for i in range(3):
        files.write(bytes([i]) * 16, StateCheckpoint(10 + i, b"z" * 50))
    assert gate.entered.wait(5)
    threading.Timer(0.2, gate.release).start()
    files.close()
    assert len(files.index()) == 3 and files.stats()["pending_writes"] == 0
    assert not files.write(bytes([9]) * 16, StateCheckpoint(5, b"w" * 50))
    files.close()  # twice: nothing more


def test_with_a_shared_store_a_turn_start_also_stops_at_the_chunk_boundary_below_it():
    """The shared store keys checkpoints by whole chunks: with one (`align`), each turn start adds
    a stop at the multiple of the chunk at or below it, so the store can keep a state there."""
    from server.cache.checkpointed_slots import SlotStates

    mem = SimMemory(SWA)
    prompt = [1, 100] + list(range(200, 270)) + [2, 50] + [1, 101] + list(range(300, 330)) + [2, 50, 1, 102]
    plain = admission(prompt, Slot(index=0, seq_id=1), 0)
    SlotStates(mem, SWA, per_slot=8, every=1024).set_stops(plain.seq, 0)  # type: ignore[arg-type]
    aligned = admission(prompt, Slot(index=0, seq_id=1), 0)
    SlotStates(mem, SWA, per_slot=8, every=1024, align=16).set_stops(aligned.seq, 0)  # type: ignore[arg-type]
    extra = set(aligned.seq.prefill_stops) - set(plain.seq.prefill_stops)
    assert extra and all(p % 16 == 0 for p in extra), (plain.seq.prefill_stops, aligned.seq.prefill_stops)
    assert {p - p % 16 for p in plain.seq.prefill_stops if p < len(prompt) - 1} <= set(aligned.seq.prefill_stops)


def test_checkpoint_store_lists_the_checkpoints_of_a_path_at_chunk_boundaries():
    from server.cache.checkpoint_store import CheckpointStore

    store = CheckpointStore(budget_bytes=1000)
    path = list(range(100))
    for pos in (16, 40, 64, 96):
        store.put(path, StateCheckpoint(pos, b"x" * 10))
    store.put(list(range(32)) + [7] * 68, StateCheckpoint(48, b"y"))  # another path
    assert [c.pos for c in store.on_path(path, 16)] == [16, 64, 96]
    assert [c.pos for c in store.on_path(path[:70], 16)] == [16, 64]


def test_a_written_back_slot_hands_over_checkpoints_at_least_a_gap_apart():
    """The host store keeps a slot's checkpoints at least MIN_GAP tokens apart (the shallower of
    two close ones serves both prefixes); the end of a short reply adds no checkpoint after the
    one before the prompt's last token."""
    from server.cache.checkpoint_store import CheckpointStore
    from server.cache.checkpointed_slots import MIN_GAP, SlotStates

    mem = SimMemory(SWA)
    store = CheckpointStore(budget_bytes=1 << 20)
    states = SlotStates(mem, SWA, per_slot=8, every=1024, store=store)  # type: ignore[arg-type]
    slot = Slot(index=0, seq_id=3)
    slot.tokens = list(range(1000, 1405))
    for pos in (100, 100 + MIN_GAP // 2, 300, 399):
        mem.fill(3, pos)
        states.of(slot).add(StateCheckpoint(pos, f"3:{pos}".encode()))
    mem.fill(3, 405)
    states.hand_over(slot)
    assert sorted(store._positions) == [100, 300, 399], store._positions
    slot.tokens = list(range(2000, 2500))  # a long reply after the last one: its end is kept
    states.of(slot).clear()
    states.of(slot).add(StateCheckpoint(399, b"3:399"))
    mem.fill(3, 500)
    states.hand_over(slot)
    assert store.best(slot.tokens, 500).pos == 500


def test_a_checkpoint_write_the_process_died_in_is_deleted_at_the_next_start(tmp_path):
    """A killed process leaves its half-written temp file; the next start deletes it (no file
    leaks) and keeps the finished checkpoints."""
    from server.cache.checkpoint_files import CheckpointFiles

    files = CheckpointFiles(tmp_path, "fp", 1 << 20)
    files.write(b"\x01" * 16, StateCheckpoint(10, b"done"))
    files.close()
    torn = tmp_path / f"{'02' * 16}.7.tmp"
    torn.write_bytes(b'{"magic": "arbor-checkpoint-1", "fingerprint": "fp"')  # cut mid-header
    again = CheckpointFiles(tmp_path, "fp", 1 << 20)
    try:
        assert not torn.exists()
        assert [p for _, p in again.index()] == [10]
    finally:
        again.close()
