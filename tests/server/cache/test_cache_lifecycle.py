"""Cache lifecycle hints: parsing, validation errors, session registry."""

from __future__ import annotations

import pytest

from server.cache.eviction import LifecycleClass, LifecyclePolicy
from server.cache.lifecycle import (
    MAX_NODE_SESSIONS,
    PIN_HEADER,
    SESSION_HEADER,
    STATE_HEADER,
    CacheHint,
    CacheHintError,
    SessionRegistry,
    parse_cache_hint,
)
from tests.server.cache.sim_payload import simulated_tree


def test_no_hint_gives_the_empty_hint():
    assert parse_cache_hint({}, {}).is_empty
    assert parse_cache_hint({"cache": None}, None) == CacheHint()
    assert parse_cache_hint(None, None) == CacheHint()


def test_body_hint():
    hint = parse_cache_hint({"cache": {"session": "s1", "state": "tool_wait", "pin": True}})
    assert hint == CacheHint("s1", "tool_wait", True)


def test_header_hint_case_insensitive_names_and_values():
    hint = parse_cache_hint(
        None, {"x-arbor-session": " s2 ", "X-ARBOR-CACHE-STATE": "done", PIN_HEADER: "Yes"}
    )
    assert hint == CacheHint("s2", "done", True)
    assert parse_cache_hint(None, {SESSION_HEADER: "s", PIN_HEADER: "0"}).pin is False


def test_body_wins_field_by_field():
    hint = parse_cache_hint(
        {"cache": {"state": "active"}},
        {SESSION_HEADER: "from-header", STATE_HEADER: "done", PIN_HEADER: "true"},
    )
    assert hint == CacheHint("from-header", "active", True)
    hint = parse_cache_hint({"cache": {"session": "body", "pin": False}}, {SESSION_HEADER: "h", PIN_HEADER: "1"})
    assert hint == CacheHint("body", None, False)


@pytest.mark.parametrize(
    ("body", "headers", "param"),
    [
        ({"cache": "yes"}, None, "cache"),
        ({"cache": {"session": "s", "sesion": "x"}}, None, "cache"),
        ({"cache": {"session": 42}}, None, "cache.session"),
        ({"cache": {"session": ""}}, None, "cache.session"),
        ({"cache": {"session": "x" * 257}}, None, "cache.session"),
        ({"cache": {"session": "a\nb"}}, None, "cache.session"),
        ({"cache": {"session": "s", "state": "sleeping"}}, None, "cache.state"),
        ({"cache": {"session": "s", "pin": "true"}}, None, "cache.pin"),
        ({"cache": {"session": "s", "pin": 1}}, None, "cache.pin"),
        ({"cache": {"state": "done"}}, None, "cache.state"),
        ({"cache": {"pin": True}}, None, "cache.pin"),
        (None, {SESSION_HEADER: "s", PIN_HEADER: "maybe"}, PIN_HEADER),
        (None, {SESSION_HEADER: "s", STATE_HEADER: "DONE"}, STATE_HEADER),
        (None, {STATE_HEADER: "tool_wait"}, STATE_HEADER),
        (None, {SESSION_HEADER: ""}, SESSION_HEADER),
    ],
)
def test_invalid_hints_raise_with_the_offending_field(body, headers, param):
    with pytest.raises(CacheHintError) as err:
        parse_cache_hint(body, headers)
    assert err.value.param == param
    assert str(err.value)
    assert isinstance(err.value, ValueError)


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


def test_pin_false_is_kept_apart_from_no_pin():
    assert parse_cache_hint({"cache": {"session": "s"}}).pin is None
    assert parse_cache_hint({"cache": {"session": "s", "pin": False}}).pin is False
    assert parse_cache_hint(None, {SESSION_HEADER: "s", PIN_HEADER: "off"}).pin is False
    assert parse_cache_hint({"cache": {"pin": False}}).is_empty, "pin: false without a session says nothing"


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
    with pytest.raises(CacheHintError) as err:
        reg.apply(CacheHint())
    assert err.value.param == "session"


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
