"""Cache lifecycle hints: parsing, validation errors, session registry."""

from __future__ import annotations

import gc

import pytest

from server.cache.lifecycle import (
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
    assert reg.sessions() == ()
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
    assert reg.summary() == {"sessions": 2, "pinned": 1, "by_state": {"active": 1, "tool_wait": 1, "done": 0}}


def test_releasing_an_unknown_session_records_nothing():
    reg = SessionRegistry()
    for hint in (CacheHint("gone", "done"), CacheHint("gone", pin=False), CacheHint("gone")):
        status = reg.apply(hint)
        assert not status.known and status.state is None and not status.pinned
    assert reg.sessions() == ()
    with pytest.raises(CacheHintError) as err:
        reg.apply(CacheHint())
    assert err.value.param == "session"


def test_registry_tips_follow_a_growing_conversation_and_keep_branches():
    tree, insert = simulated_tree()
    reg = SessionRegistry()
    t1 = insert([1, 2]).last_node
    reg.observe(CacheHint("s"), t1)
    t2 = insert([1, 2, 3, 4]).last_node
    reg.observe(CacheHint("s"), t2)
    assert reg.tips("s") == (t2,), "the older tip is an ancestor of the new one"
    branch = insert([1, 2, 7]).last_node
    reg.observe(CacheHint("s"), branch)
    assert set(reg.tips("s")) == {t2, branch}
    assert all("s" in n.sessions for n in tree.nodes())


def test_registry_drops_evicted_tips_without_holding_them():
    tree, insert = simulated_tree()
    reg = SessionRegistry()
    tip = insert([1, 2]).last_node
    reg.observe(CacheHint("s"), tip)
    res = tree.flush("H")
    assert reg.tips("s") == ()
    del res, tip
    gc.collect()
    assert len(reg._sessions["s"].tips) == 0


def test_forget_removes_session_and_tags():
    tree, insert = simulated_tree()
    reg = SessionRegistry()
    reg.observe(CacheHint("a", "done"), insert([1, 2]).last_node)
    reg.observe(CacheHint("b", "active"), insert([1, 3]).last_node)
    assert reg.forget_done(tree) == 1
    assert reg.sessions() == ("b",)
    assert all("a" not in n.sessions for n in tree.nodes())
    reg.forget("b", tree.nodes())
    assert reg.sessions() == () and all(not n.sessions for n in tree.nodes())
