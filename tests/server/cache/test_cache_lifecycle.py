"""Cache lifecycle hints: the session registry (reading hints out of requests:
tests/server/api/http/test_cache_fields.py)."""

from __future__ import annotations

import pytest

from server.cache.eviction import LifecycleClass, LifecyclePolicy
from server.cache.lifecycle import MAX_NODE_SESSIONS, CacheHint, SessionRegistry
from tests.server.cache.sim_payload import simulated_tree


def test_registry_records_latest_state_and_pins():
    reg = SessionRegistry()
    reg.observe(CacheHint())  # no session: ignored
    assert reg.summary()["sessions"] == 0
    reg.observe(CacheHint("s"))
    assert reg.state("s") == "active" and not reg.is_pinned("s")
    reg.observe(CacheHint("s", "tool_wait", pin=True))
    assert reg.state("s") == "tool_wait" and reg.is_pinned("s")
    reg.observe(CacheHint("s", "active"))
    assert reg.is_pinned("s"), "a hint that does not name the pin keeps it"
    reg.observe(CacheHint("s", "done", pin=True))
    assert reg.state("s") == "done" and reg.is_pinned("s"), "a finished turn on a branch the user looks at"
    reg.observe(CacheHint("s", "done"))
    assert reg.state("s") == "done" and not reg.is_pinned("s"), "done without a pin releases it"
    reg.observe(CacheHint("s", "tool_wait", pin=True))
    reg.observe(CacheHint("s", "tool_wait", pin=False))
    assert reg.state("s") == "tool_wait" and not reg.is_pinned("s"), "pin: false unpins"
    assert reg.state("unknown") is None


def test_bare_hints_change_only_what_they_name():
    reg = SessionRegistry()
    assert reg.apply(CacheHint("s", "tool_wait")).to_dict() == {
        "session": "s", "state": "tool_wait", "pinned": False, "known": True}
    assert reg.apply(CacheHint("s", pin=True)).to_dict() == {
        "session": "s", "state": "tool_wait", "pinned": True, "known": True}, "no state: the state stays"
    assert reg.apply(CacheHint("s", pin=False)).state == "tool_wait"
    assert reg.apply(CacheHint("new", pin=True)).state == "active", "an unknown session pinned becomes active"
    reg.apply(CacheHint("new", "done", pin=True))
    assert reg.apply(CacheHint("new")).pinned, "a hint naming neither state nor pin changes nothing"
    reg.apply(CacheHint("new", "tool_wait"))
    assert reg.apply(CacheHint("new", "done")).pinned is False, "done named alone releases"
    reg.apply(CacheHint("new", "active", pin=True))
    assert reg.summary() == {"sessions": 2, "max_sessions": 4096, "pinned": 1, "max_pinned": None,
                             "pinned_bytes": 0, "max_pinned_bytes": None, "pins_released": 0,
                             "by_state": {"active": 1, "tool_wait": 1, "done": 0}, "aged_out": 0}


def test_releasing_an_unknown_session_records_nothing():
    reg = SessionRegistry()
    for hint in (CacheHint("gone", "done"), CacheHint("gone", pin=False), CacheHint("gone")):
        status = reg.apply(hint)
        assert not status.known and status.state is None and not status.pinned
    assert reg.summary()["sessions"] == 0
    with pytest.raises(ValueError, match="needs a session"):
        reg.apply(CacheHint())


def test_observe_tags_the_whole_path_and_branches():
    tree, insert = simulated_tree()
    reg = SessionRegistry()
    reg.observe(CacheHint("s"), insert([1, 2]).last_node)
    reg.observe(CacheHint("s"), insert([1, 2, 3, 4]).last_node)
    reg.observe(CacheHint("s"), insert([1, 2, 7]).last_node)
    assert all(n.sessions == {"s"} for n in tree.nodes())


class Clock:
    def __init__(self):
        self.now = 0.0

    def __call__(self):
        return self.now


def test_sessions_that_send_no_hint_for_a_while_are_forgotten():
    clock = Clock()
    reg = SessionRegistry(idle_seconds=60, clock=clock)
    reg.observe(CacheHint("old", "tool_wait", pin=True))
    clock.now = 30
    reg.observe(CacheHint("recent"))
    clock.now = 61
    reg.observe(CacheHint("new"))
    assert not reg.status("old").known, "idle past the limit, even pinned"
    assert reg.status("recent").known and reg.status("new").known
    assert reg.summary()["sessions"] == 2 and reg.summary()["aged_out"] == 1


def test_finished_sessions_are_kept_up_to_a_bound_oldest_first():
    reg = SessionRegistry(max_done=3)
    for i in range(10):
        reg.observe(CacheHint(f"s{i}", "done"))
    reg.observe(CacheHint("live"))
    assert [reg.status(f"s{i}").known for i in range(10)] == [False] * 7 + [True] * 3
    assert reg.status("live").known
    reg.observe(CacheHint("s9", "active"))  # back from done: no longer counts as finished
    for i in range(10, 13):
        reg.observe(CacheHint(f"s{i}", "done"))
    assert reg.status("s9").known and not reg.status("s7").known


def test_the_registry_never_holds_more_than_max_sessions():
    reg = SessionRegistry(max_sessions=100)
    for i in range(1000):
        reg.observe(CacheHint(f"s{i}", "active"))
        assert reg.summary()["sessions"] <= 100
    assert reg.status("s999").known and not reg.status("s0").known


def test_a_node_every_session_passes_keeps_a_bounded_set_and_its_rank():
    tree, insert = simulated_tree()
    reg = SessionRegistry()
    policy = LifecyclePolicy(reg)
    system = insert([1, 2, 3]).last_node
    reg.observe(CacheHint("waiting", "tool_wait"), insert([1, 2, 3, 99]).last_node)
    for i in range(500):
        reg.observe(CacheHint(f"s{i}", "done" if i % 2 else "active"), insert([1, 2, 3, 100 + i]).last_node)
        assert len(system.sessions) <= MAX_NODE_SESSIONS
    reg.observe(CacheHint("pinned", pin=True), insert([1, 2, 3, 7]).last_node)
    assert "waiting" in system.sessions and "pinned" in system.sessions
    assert policy.classify(system) is None, "a pinned session still protects the shared prefix"
    reg.observe(CacheHint("pinned", "done"))
    assert policy.classify(system) is LifecycleClass.TOOL_WAIT
