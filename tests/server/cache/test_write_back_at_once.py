"""A slot taken while other requests decode (server/cache/write_back_policy.py, `write_back`
with `park=True`): a copy that fits in what is left of the engine step's write-back budget is
stored at once, in the cells it frees, not parked (issue 36: a parked copy holds its cells
while the new prompt is computed, so the prompt lands elsewhere and the hole left behind is
later filled in pieces; scattered sequences cost paged attention more). A larger copy is parked
and stored a bounded piece per step, as before, and no step stores more than its budget."""

from __future__ import annotations

import random
from types import SimpleNamespace

from server.cache.engine_time import EngineTime
from server.cache.lifecycle import SessionRegistry
from server.cache.tiers import Source
from server.cache.write_back_policy import WriteBackPolicy
from tests.server.cache.sim_payload import simulated_tree

M = 16  # min_tokens
BPT = 2  # KV bytes per token of the fake host
STEP = 1000  # write-back bytes per engine step


class FakeRuntime:
    """Sequences as position counts: enough for parking (seq_cp, seq_pos_min/max, seq_rm)."""

    def __init__(self, bytes_per_token: int = BPT):
        self.n: dict[int, int] = {}
        self.bytes_per_token = bytes_per_token

    def seq_cp(self, src: int, dst: int, p0: int = -1, p1: int = -1) -> None:
        self.n[dst] = p1 - max(p0, 0) if p1 >= 0 else self.n.get(src, 0)

    def seq_rm(self, seq_id: int, p0: int = -1, p1: int = -1) -> bool:
        self.n[seq_id] = max(p0, 0) if p0 > 0 else 0
        return True

    def seq_pos_min(self, seq_id: int) -> int:
        return 0 if self.n.get(seq_id) else -1

    def seq_pos_max(self, seq_id: int) -> int:
        return self.n.get(seq_id, 0) - 1

    def state_seq_size(self, seq_id: int) -> int:
        return self.n.get(seq_id, 0) * self.bytes_per_token + 24  # a header, as llama.cpp's


class FakeHost:
    source = Source.H

    def __init__(self, bytes_per_token: int = BPT):
        self.bytes_per_token = bytes_per_token
        self.stored: list[int] = []  # the length of each store's path

    def store(self, tokens, kv):
        self.stored.append(len(tokens))
        return None  # no tip needed here (a parked copy is then done after its piece)


class FakeSeqIds:
    layout = SimpleNamespace(parked=2)

    def __init__(self):
        self.free = [90, 91]

    def take(self, kind: str) -> int:
        from server.engine.seq_ids import SequenceIdsExhausted
        if not self.free:
            raise SequenceIdsExhausted(kind)
        return self.free.pop(0)

    def give(self, kind: str, seq_id: int) -> None:
        self.free.append(seq_id)


def policy(host_bpt: int = BPT):
    slots = [SimpleNamespace(index=i, seq_id=i, tokens=[], busy=False, last_used=0) for i in range(4)]
    runtime = FakeRuntime()
    kv = SimpleNamespace(seq_ids=FakeSeqIds(), extract=lambda *a: None)
    tree, _ = simulated_tree()
    pol = WriteBackPolicy(runtime=runtime, kv=kv, slots=SimpleNamespace(slots=slots, idle=slots),  # type: ignore[arg-type]
                          running=lambda: [], tree=tree, tiers=[FakeHost(host_bpt)],  # type: ignore[list-item]
                          registry=SessionRegistry(), min_tokens=M, resident_cells=None,
                          step_bytes=STEP, idle_cells=None, clock=EngineTime(), beside=False)  # in pieces
    pol.gate.streak = 1000  # every loss is stored: this is about how, not whether
    return pol, runtime, slots


def take(pol, runtime, slot, n: int, seed: int) -> None:
    """`slot` holds `n` tokens of its own and is taken while others decode."""
    rng = random.Random(seed)
    slot.tokens = [rng.randrange(2000, 50000) for _ in range(n)]
    runtime.n[slot.seq_id] = n
    pol.write_back(slot, exclude=slot, park=True)


def test_a_copy_within_the_step_budget_is_stored_at_once_not_parked():
    pol, runtime, (slot, *_) = policy()
    take(pol, runtime, slot, 300, seed=1)  # 600 bytes of a 1000-byte step
    assert pol.host.stored == [300]
    assert pol.parked.parked == 0 and not pol.parked.queue and pol.write_backs == 1


def test_a_copy_beyond_the_step_budget_is_parked_as_before():
    pol, runtime, (slot, *_) = policy()
    take(pol, runtime, slot, 600, seed=1)  # 1200 bytes
    assert pol.host.stored == [] and pol.parked.parked == 1 and pol.write_backs == 1
    pol.background(idle=False)
    assert pol.host.stored == [STEP // BPT]  # one bounded piece


def test_one_step_never_stores_more_than_its_budget():
    pol, runtime, (a, b, c, d) = policy()
    take(pol, runtime, a, 200, seed=1)  # 400 bytes: at once
    take(pol, runtime, b, 200, seed=2)  # 400 more: at once, 800 of 1000
    take(pol, runtime, c, 200, seed=3)  # 400 would pass the budget: parked
    assert pol.host.stored == [200, 200] and pol.parked.parked == 1
    pol.background(idle=False)  # the parked copy gets what is left of this step: 200 bytes
    assert pol.host.stored == [200, 200, 100]
    take(pol, runtime, d, 200, seed=4)  # a new step, a new budget
    assert pol.host.stored == [200, 200, 100, 200] and pol.parked.parked == 1


def test_before_the_host_knows_the_kv_size_the_state_size_decides():
    pol, runtime, (slot, other, *_) = policy(host_bpt=0)
    take(pol, runtime, slot, 300, seed=1)  # state: 624 bytes
    assert pol.host.stored == [300] and pol.parked.parked == 0
    pol.background(idle=False)
    take(pol, runtime, other, 600, seed=2)  # 1224 bytes
    assert pol.parked.parked == 1
