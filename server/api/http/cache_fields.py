"""A request's cache fields as HTTP carries them, read before anything is rendered.

The lifecycle hint (server.cache.lifecycle.CacheHint): a request may carry ``{"cache":
{"session": "...", "state": "active|tool_wait|done", "pin": true, "tool": "..."}}`` in its body, or
the headers ``X-Arbor-Session``, ``X-Arbor-Cache-State``, ``X-Arbor-Cache-Pin`` and ``X-Arbor-Cache-Tool``
(other servers ignore both); OpenAI's ``prompt_cache_key`` is its session unless ``cache.session`` names one.
``POST /cache/hint`` takes the same fields without a generation.

The namespace (server.engine.cache_namespace): the request's ``cache_salt`` and, under
--cache-salt-per-key, the API key it authenticated with.

``read_cache_scope`` reads both into the ``CacheScope`` the engine bridge puts on the engine
request; a malformed hint is a 400 naming the field or header.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from fastapi import Request

from server.api.http.deps import api_key_id, authenticated_key
from server.api.http.errors import invalid
from server.cache.lifecycle import CACHE_STATES, CacheHint, CacheState
from server.engine.cache_namespace import request_namespace
from server.settings import ServerSettings

SESSION_HEADER = "X-Arbor-Session"
STATE_HEADER = "X-Arbor-Cache-State"
PIN_HEADER = "X-Arbor-Cache-Pin"
TOOL_HEADER = "X-Arbor-Cache-Tool"

MAX_SESSION_LEN = 256
_BODY_KEYS = frozenset({"session", "state", "pin", "tool"})
_TRUE = frozenset({"1", "true", "yes", "on"})
_FALSE = frozenset({"0", "false", "no", "off"})


class CacheHintError(ValueError):
    """A cache hint is malformed; the API answers 400 with ``param`` and ``str(err)``."""

    def __init__(self, message: str, param: str) -> None:
        super().__init__(message)
        self.param = param


def _check_session(value: Any, param: str) -> str:
    if not isinstance(value, str):
        raise CacheHintError(f"{param} must be a string, got {type(value).__name__}", param)
    if not value or len(value) > MAX_SESSION_LEN:
        raise CacheHintError(f"{param} must be 1..{MAX_SESSION_LEN} characters long", param)
    if not value.isprintable():
        raise CacheHintError(f"{param} must not contain control characters", param)
    return value


def _check_state(value: Any, param: str) -> CacheState:
    if not isinstance(value, str) or value not in CACHE_STATES:
        raise CacheHintError(f"{param} must be one of {', '.join(CACHE_STATES)}; got {value!r}", param)
    return value  # type: ignore[return-value]


def _header(headers: Mapping[str, str], name: str) -> str | None:
    # Starlette's Headers are case-insensitive already; plain dicts may not be.
    value = headers.get(name)
    if value is None:
        lowered = name.lower()
        value = next((v for k, v in headers.items() if k.lower() == lowered), None)
    return value


def parse_cache_hint(
    body: Mapping[str, Any] | None = None, headers: Mapping[str, str] | None = None
) -> CacheHint:
    """Build a CacheHint from a request body and/or headers.

    Field by field, a key present in ``body["cache"]`` wins over its header.
    ``body["cache"]`` may be absent or null.  Rules (each violation raises
    CacheHintError naming the offending field):

    * session: a printable string of 1..256 characters;
    * state: one of active, tool_wait, done;
    * pin: a JSON boolean in the body; true/false/1/0/yes/no/on/off in the header;
    * state and ``pin: true`` need a session (a pin without a session could
      never be released); ``pin: false`` without a session says nothing;
    * tool: a printable string of 1..256 characters (the tool, or the tools joined,
      that a ``tool_wait`` waits on); it needs the state ``tool_wait``;
    * unknown keys in ``body["cache"]`` are rejected (a typo would otherwise
      silently disable the hint).
    """
    fields: dict[str, tuple[Any, str]] = {}
    if headers is not None:
        for key, name in (("session", SESSION_HEADER), ("state", STATE_HEADER), ("pin", PIN_HEADER),
                          ("tool", TOOL_HEADER)):
            raw = _header(headers, name)
            if raw is not None:
                fields[key] = (raw.strip(), name)
        if "pin" in fields:
            raw, name = fields["pin"]
            low = raw.lower()
            if low not in _TRUE | _FALSE:
                raise CacheHintError(f"{name} must be true or false, got {raw!r}", name)
            fields["pin"] = (low in _TRUE, name)

    ext = body.get("cache") if body is not None else None
    if ext is not None:
        if not isinstance(ext, Mapping):
            raise CacheHintError(f"cache must be an object, got {type(ext).__name__}", "cache")
        unknown = sorted(set(ext) - _BODY_KEYS)
        if unknown:
            raise CacheHintError(
                f"unknown key(s) in cache: {', '.join(map(str, unknown))} (allowed: pin, session, state, tool)",
                "cache",
            )
        for key in _BODY_KEYS & set(ext):
            if ext[key] is not None:
                fields[key] = (ext[key], f"cache.{key}")
        if "pin" in ext and ext["pin"] is not None and not isinstance(ext["pin"], bool):
            raise CacheHintError(f"cache.pin must be a boolean, got {type(ext['pin']).__name__}", "cache.pin")

    session = _check_session(*fields["session"]) if "session" in fields else None
    state = _check_state(*fields["state"]) if "state" in fields else None
    pin = bool(fields["pin"][0]) if "pin" in fields else None
    tool = _check_session(*fields["tool"]) if "tool" in fields else None  # the same rules as a session name
    if tool is not None and state != "tool_wait":
        param = fields["tool"][1]
        raise CacheHintError(f"{param} names the tool a tool_wait waits on: it needs the state tool_wait", param)
    if session is None and (state is not None or pin):
        param = fields["state"][1] if state is not None else fields["pin"][1]
        raise CacheHintError(f"{param} needs a session (cache.session or {SESSION_HEADER})", param)
    return CacheHint(session=session, state=state, pin=pin if session is not None else None, tool=tool)


def has_arbor_hint(body_cache: object, headers: Mapping[str, str] | None) -> bool:
    """Whether the client sent Arbor's own lifecycle hint (body or headers), even an empty one."""
    if body_cache is not None:
        return True
    return headers is not None and any(_header(headers, name) is not None
                                       for name in (SESSION_HEADER, STATE_HEADER, PIN_HEADER, TOOL_HEADER))


def request_cache_hint(cache: Any, prompt_cache_key: str | None, headers: Mapping[str, str] | None) -> CacheHint | None:
    """The request's lifecycle hint: `cache` and the X-Arbor-* headers, with OpenAI's
    `prompt_cache_key` as its session unless `cache.session` names one (a body field wins over
    a header, as each of `cache`'s own keys does); None for no hint; 400 for a malformed one."""
    if prompt_cache_key is not None and (cache is None or isinstance(cache, Mapping)):
        cache = {**(cache or {})}
        if cache.get("session") is None:
            cache["session"] = prompt_cache_key
    try:
        hint = parse_cache_hint({"cache": cache}, headers)
    except CacheHintError as exc:
        raise invalid(str(exc), param=exc.param) from exc
    return None if hint.is_empty else hint


def cache_namespace(cache_salt: str | None, http: Request | None, settings: ServerSettings) -> bytes | None:
    """The request's cache namespace (cache isolation, docs/server.md): its `cache_salt`, and
    under --cache-salt-per-key the key it authenticated with (a hash of it); None without either,
    and the request shares the prefix cache with every other such request."""
    key_id = None
    if settings.cache_salt_per_key and http is not None:
        key = authenticated_key(http.headers.get("authorization"), settings.api_key,
                                x_api_key=http.headers.get("x-api-key"))
        key_id = api_key_id(key) if key is not None else None
    return request_namespace(salt=cache_salt, key_id=key_id)


@dataclass(frozen=True)
class CacheScope:
    """What a request tells the prefix cache: its lifecycle hint, its namespace, and whether the
    client sent Arbor's own hint at all (an Anthropic breakpoint's pin gives way to it)."""

    hint: CacheHint | None = None
    namespace: bytes | None = None
    client_hint: bool = False


NO_CACHE_SCOPE = CacheScope()  # a request that tells the cache nothing (no hint, no namespace)


def read_cache_scope(http: Request | None, settings: ServerSettings, *, cache: Any = None,
                     prompt_cache_key: str | None = None, cache_salt: str | None = None) -> CacheScope:
    """The cache fields of a request whose body carries `cache`, `prompt_cache_key` and
    `cache_salt` (and whose headers and API key `http` has); 400 for a malformed hint."""
    headers = http.headers if http is not None else None
    return CacheScope(request_cache_hint(cache, prompt_cache_key, headers), cache_namespace(cache_salt, http, settings),
                      has_arbor_hint(cache, headers))
