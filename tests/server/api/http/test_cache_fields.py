"""A request's cache fields: the lifecycle hint read out of its body and headers, validation
errors naming the field or header (no model)."""

from __future__ import annotations

import pytest

from server.api.http.cache_fields import (
    PIN_HEADER,
    SESSION_HEADER,
    STATE_HEADER,
    TOOL_HEADER,
    CacheHintError,
    has_arbor_hint,
    parse_cache_hint,
    request_cache_hint,
)
from server.api.http.errors import APIError
from server.cache.lifecycle import CacheHint


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
        ({"cache": {"session": "s", "state": "active", "tool": "grep"}}, None, "cache.tool"),
        ({"cache": {"session": "s", "tool": "grep"}}, None, "cache.tool"),
        ({"cache": {"session": "s", "state": "tool_wait", "tool": 7}}, None, "cache.tool"),
        ({"cache": {"session": "s", "state": "tool_wait", "tool": ""}}, None, "cache.tool"),
        (None, {SESSION_HEADER: "s", STATE_HEADER: "done", TOOL_HEADER: "grep"}, TOOL_HEADER),
    ],
)
def test_invalid_hints_raise_with_the_offending_field(body, headers, param):
    with pytest.raises(CacheHintError) as err:
        parse_cache_hint(body, headers)
    assert err.value.param == param
    assert str(err.value)
    assert isinstance(err.value, ValueError)


def test_a_tool_wait_names_its_tool_in_the_body_or_a_header():
    hint = parse_cache_hint({"cache": {"session": "s", "state": "tool_wait", "tool": "query_logs+grep"}})
    assert hint == CacheHint(session="s", state="tool_wait", tool="query_logs+grep")
    assert parse_cache_hint(None, {SESSION_HEADER: "s", STATE_HEADER: "tool_wait", TOOL_HEADER: "grep"}).tool == "grep"
    assert has_arbor_hint(None, {TOOL_HEADER: "grep"})


def test_pin_false_is_kept_apart_from_no_pin():
    assert parse_cache_hint({"cache": {"session": "s"}}).pin is None
    assert parse_cache_hint({"cache": {"session": "s", "pin": False}}).pin is False
    assert parse_cache_hint(None, {SESSION_HEADER: "s", PIN_HEADER: "off"}).pin is False
    assert parse_cache_hint({"cache": {"pin": False}}).is_empty, "pin: false without a session says nothing"


def test_prompt_cache_key_is_the_session_unless_cache_names_one():
    assert request_cache_hint(None, "pk", None) == CacheHint("pk")
    assert request_cache_hint({"state": "done"}, "pk", None) == CacheHint("pk", "done")
    assert request_cache_hint({"session": "own"}, "pk", None) == CacheHint("own")
    assert request_cache_hint(None, None, {SESSION_HEADER: "h"}) == CacheHint("h")
    assert request_cache_hint({}, None, None) is None, "an empty hint is no hint"
    with pytest.raises(APIError) as err:
        request_cache_hint({"sesion": "x"}, None, None)
    assert (err.value.status, err.value.param) == (400, "cache")


def test_whether_the_client_sent_its_own_hint():
    assert has_arbor_hint({}, None), "an empty cache field is still the client's"
    assert has_arbor_hint(None, {"x-arbor-cache-pin": "true"})
    assert not has_arbor_hint(None, {"authorization": "Bearer k"}) and not has_arbor_hint(None, None)
