"""The write-back gate (server/cache/write_back_policy.py, `ReuseGate`) without a model: which
lost slot copies are stored, which are skipped, and how comebacks teach it. Then the policy
around it over fake slots and a fake host tier: a skipped copy is counted and stores nothing,
resident owners and `drop_device_copies` are never gated, hints override the learned rule."""

from __future__ import annotations

import random
from types import SimpleNamespace

from server.cache.engine_time import EngineTime
from server.cache.lifecycle import CacheHint, CacheState, SessionRegistry
from server.cache.tiers import Source
from server.cache.write_back_policy import ReuseGate, WriteBackPolicy
from tests.server.cache.sim_payload import FakePayload, simulated_tree

M = 16  # min_tokens
TEMPLATE = list(range(1000, 1025))  # what a chat template puts before every prompt (25 tokens)


def unique(i: int, n: int = 200) -> list[int]:
    """A prompt sharing only the template with any other."""
    rng = random.Random(i)
    return TEMPLATE + [rng.randrange(2000, 50000) for _ in range(n)]


# ------------------------------------------------------------------ the rule alone
def test_a_fresh_gate_stores_its_first_losses_then_skips_what_never_comes_back():
    gate = ReuseGate(M, streak=4)
    reasons = [gate.decide(unique(i), len(TEMPLATE)) for i in range(20)]
    assert reasons[:4] == ["cold_start"] * 4 and reasons[4:] == [None] * 16
    assert gate.skipped == 16 and gate.losses == 20 and gate.comebacks == 0 and gate.missed == 0


def test_a_comeback_opens_the_gate_again_and_is_counted_as_missed_when_skipped():
    gate = ReuseGate(M, streak=2)
    lost = [unique(i) for i in range(4)]
    assert [gate.decide(t, len(TEMPLATE)) for t in lost] == ["cold_start", "cold_start", None, None]
    gate.admitted(lost[3] + [7, 8, 9])  # the next turn of a conversation whose copy was skipped
    assert gate.comebacks == 1 and gate.missed == 1 and gate.since_comeback == 0
    assert gate.decide(unique(10), len(TEMPLATE)) == "recent_reuse"
    gate.admitted(lost[0] + [1])  # a stored copy came back: a comeback, not a miss
    assert gate.comebacks == 2 and gate.missed == 1
    gate.admitted(lost[0] + [1])  # its key is gone once seen: one comeback per loss
    assert gate.comebacks == 2


def test_a_comeback_needs_min_tokens_beyond_what_was_held_and_the_same_prefix():
    gate = ReuseGate(M, streak=0)  # skip everything the hints do not save
    lost = unique(1)
    assert gate.decide(lost, len(TEMPLATE)) is None
    gate.admitted(lost[:len(TEMPLATE) + M - 1])  # one token short of a key
    gate.admitted(TEMPLATE + [5] + lost[len(TEMPLATE) + 1:])  # differs inside the novel part
    other_prefix = [9] * len(TEMPLATE) + lost[len(TEMPLATE):]  # the same novel tokens after another prefix
    gate.admitted(other_prefix)
    assert gate.comebacks == 0
    gate.admitted(lost[:len(TEMPLATE) + M])
    assert gate.comebacks == 1 and gate.missed == 1


def test_hints_store_whatever_the_learned_rule_says():
    gate = ReuseGate(M, streak=0)
    assert gate.decide(unique(1), len(TEMPLATE), pinned=True) == "pinned"
    assert gate.decide(unique(2), len(TEMPLATE), continues=True) == "continues"
    assert gate.decide(unique(3), len(TEMPLATE)) is None
    assert gate.stats()["stored_by_reason"] == {"pinned": 1, "continues": 1, "recent_reuse": 0, "cold_start": 0}


def test_a_copy_with_no_novel_part_worth_a_key_is_stored_as_before_and_not_counted():
    gate = ReuseGate(M, streak=0)
    tokens = unique(1, n=M - 1)
    assert gate.decide(tokens, len(TEMPLATE)) == "small"
    assert gate.losses == 0 and gate.skipped == 0


def test_keys_are_bounded_and_the_oldest_go_first():
    gate = ReuseGate(M, streak=0, max_keys=8)
    lost = [unique(i) for i in range(20)]
    for t in lost:
        gate.decide(t, len(TEMPLATE))
    assert len(gate._lost) == 8 and sum(gate._starts.values()) == 8
    gate.admitted(lost[0] + [1])  # forgotten
    assert gate.comebacks == 0
    gate.admitted(lost[-1] + [1])
    assert gate.comebacks == 1 and sum(gate._starts.values()) == 7


def test_the_agent_shape_keeps_every_store_once_sessions_come_back():
    """Sessions that come back to what they lost (each next turn extends the last): the cold
    start skips what is lost beyond the streak before any comeback (the cost of the rule, for
    losses no hint vouches for); from the first comeback on, nothing is skipped."""
    gate = ReuseGate(M, streak=2)
    history = {s: unique(100 + s) for s in range(6)}
    first_turn = []
    for turn in range(4):
        for s in range(6):
            gate.admitted(history[s])  # the turn's prompt extends what the session lost
            history[s] = history[s] + [s * 100 + turn] * 40  # its reply and the next message
            reason = gate.decide(history[s], len(TEMPLATE))
            if turn == 0:
                first_turn.append(reason)
            else:
                assert reason == "recent_reuse"
    assert first_turn == ["cold_start"] * 2 + [None] * 4
    assert gate.skipped == 4 and gate.comebacks == 18 and gate.missed == 4


# ------------------------------------------------------------ the policy around it
class FakeHost:
    source = Source.H
    bytes_per_token = 2

    def __init__(self):
        self.stored: list[list[int]] = []

    def store(self, tokens, kv):
        self.stored.append(list(tokens))
        return None  # declined: the policy needs no tip for these checks


def policy(n_slots=2, *, resident=False, registry=None):
    slots = [SimpleNamespace(index=i, seq_id=i, tokens=[], busy=False, last_used=0) for i in range(n_slots)]
    runtime = SimpleNamespace(seq_rm=lambda *a: None)
    kv = SimpleNamespace(seq_ids=SimpleNamespace(layout=SimpleNamespace(parked=False)), extract=lambda *a: None)
    tree, _ = simulated_tree()
    pol = WriteBackPolicy(runtime=runtime, kv=kv, slots=SimpleNamespace(slots=slots, idle=slots),  # type: ignore[arg-type]
                          running=lambda: [], tree=tree, tiers=[FakeHost()],  # type: ignore[list-item]
                          registry=registry or SessionRegistry(), min_tokens=M, resident_cells=None,
                          step_bytes=0, idle_cells=None, clock=EngineTime())
    return pol, slots


def test_skipped_write_backs_store_nothing_and_are_counted():
    pol, (slot, other) = policy()
    pol.gate.streak = 1
    other.tokens = TEMPLATE + [1] * 30  # another slot holds the template: the novel part starts after it
    for i in range(3):
        slot.tokens = unique(i)
        pol.write_back(slot, exclude=slot)
    assert len(pol.host.stored) == 1 and pol.write_backs == 1 and pol.write_backs_skipped == 2
    assert pol.gate._starts == {len(TEMPLATE): 3}  # held elsewhere: the template


def test_a_copy_another_slot_holds_whole_is_neither_stored_nor_gated():
    pol, (slot, other) = policy()
    slot.tokens = unique(1)
    other.tokens = unique(1) + [4, 5]
    pol.write_back(slot, exclude=slot)
    assert pol.host.stored == [] and pol.write_backs_skipped == 0 and pol.gate.losses == 0


def test_a_continuing_session_is_stored_past_the_streak_and_a_done_one_is_not():
    registry = SessionRegistry()
    pol, (slot, _) = policy(registry=registry)
    pol.gate.streak = 0
    cases: list[tuple[CacheState | None, bool]] = [("tool_wait", True), ("done", False), (None, True)]
    for i, (state, stored) in enumerate(cases):
        hint = CacheHint(session=f"s{i}", state=state)
        registry.observe(hint)
        pol.slot_hints[slot.index] = hint
        slot.tokens = unique(i)
        before = len(pol.host.stored)
        pol.write_back(slot, exclude=slot)
        assert (len(pol.host.stored) > before) is stored, state
    assert pol.gate.stats()["stored_by_reason"]["continues"] == 2 and pol.write_backs_skipped == 1


def test_a_done_session_gets_the_cold_start_like_any_other():
    """A session of one request that said `done` may still share its prefix with others (the
    shared_prefix workload's groups): it is stored while the gate has no evidence either way."""
    registry = SessionRegistry()
    pol, (slot, _) = policy(registry=registry)
    hint = CacheHint(session="one", state="done")
    registry.observe(hint)
    pol.slot_hints[slot.index] = hint
    slot.tokens = unique(1)
    pol.write_back(slot, exclude=slot)
    assert pol.write_backs == 1 and pol.gate.stats()["stored_by_reason"]["cold_start"] == 1


def test_a_later_bare_hint_decides_not_the_one_the_request_carried():
    """The workbench's model requests say `active`; the turn's end comes as POST /cache/hint `done`."""
    registry = SessionRegistry()
    pol, (slot, _) = policy(registry=registry)
    pol.gate.streak = 0
    hint = CacheHint(session="w", state="active")
    registry.observe(hint)
    pol.slot_hints[slot.index] = hint
    registry.apply(CacheHint(session="w", state="done"))
    slot.tokens = unique(1)
    pol.write_back(slot, exclude=slot)
    assert pol.write_backs_skipped == 1


def test_a_pinned_session_is_stored_past_the_streak():
    registry = SessionRegistry()
    pol, (slot, _) = policy(registry=registry)
    pol.gate.streak = 0
    hint = CacheHint(session="p", state="done", pin=True)
    registry.observe(hint)
    pol.slot_hints[slot.index] = hint
    slot.tokens = unique(1)
    pol.write_back(slot, exclude=slot)
    assert pol.write_backs_skipped == 0 and pol.gate.stats()["stored_by_reason"]["pinned"] == 1


def test_drop_device_copies_and_owners_are_not_gated():
    pol, slots = policy()
    pol.gate.streak = 0
    for i, slot in enumerate(slots):
        slot.tokens = unique(i)
    pol.drop_device_copies()
    assert len(pol.host.stored) == 2 and pol.write_backs_skipped == 0
    pol.write_back_owner(7, unique(9))
    assert len(pol.host.stored) == 3


def test_the_router_tells_the_gate_of_each_admitted_prompt():
    pol, (slot, _) = policy()
    pol.gate.streak = 0
    slot.tokens = unique(1)
    pol.write_back(slot, exclude=slot)
    pol.admitted(unique(1) + [3])
    assert pol.gate.stats()["missed"] == 1


def test_what_the_tree_holds_is_not_novel():
    pol, (slot, _) = policy()
    pol.tree.insert(TEMPLATE, "H", FakePayload.factory(TEMPLATE))
    slot.tokens = unique(1)
    pol.write_back(slot, exclude=slot)
    assert pol.gate._starts == {len(TEMPLATE): 1}
