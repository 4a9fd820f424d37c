"""Cache lifecycle hints: what a client tells the server about its session.

A request may carry ``{"cache": {"session": "...", "state": "active|tool_wait|done",
"pin": true}}`` in its body, or the headers ``X-Arbor-Session``,
``X-Arbor-Cache-State`` and ``X-Arbor-Cache-Pin``.  Other servers ignore
both.  Eviction uses them (``eviction.LifecyclePolicy``): a session waiting
on a tool stays warm, a finished one goes first, a pinned one stays.

A hint rides on a generation request (it takes effect when the request
ends), or comes alone through ``POST /cache/hint`` when nothing is generated
(a turn ended, a branch was deleted, the user opened another branch):
``SessionRegistry.apply`` takes those.

``parse_cache_hint`` validates; ``SessionRegistry`` remembers each session's
latest state, its pin and the radix path tips it touched.
"""

from __future__ import annotations

import threading
import weakref
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Literal, get_args

if TYPE_CHECKING:
    from server.cache.radix_tree import RadixNode, RadixTree

CacheState = Literal["active", "tool_wait", "done"]
CACHE_STATES: tuple[str, ...] = get_args(CacheState)

SESSION_HEADER = "X-Arbor-Session"
STATE_HEADER = "X-Arbor-Cache-State"
PIN_HEADER = "X-Arbor-Cache-Pin"

MAX_SESSION_LEN = 256
_BODY_KEYS = frozenset({"session", "state", "pin"})
_TRUE = frozenset({"1", "true", "yes", "on"})
_FALSE = frozenset({"0", "false", "no", "off"})


class CacheHintError(ValueError):
    """A cache hint is malformed; the API answers 400 with ``param`` and ``str(err)``."""

    def __init__(self, message: str, param: str) -> None:
        super().__init__(message)
        self.param = param


@dataclass(frozen=True)
class CacheHint:
    """A validated lifecycle hint.  The empty hint (all defaults) means "no hint".

    ``pin``: True pins the session, False unpins it, None leaves its pin as it is.
    """

    session: str | None = None
    state: CacheState | None = None
    pin: bool | None = None

    @property
    def is_empty(self) -> bool:
        return self.session is None and self.state is None and self.pin is None


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
    * unknown keys in ``body["cache"]`` are rejected (a typo would otherwise
      silently disable the hint).
    """
    fields: dict[str, tuple[Any, str]] = {}
    if headers is not None:
        for key, name in (("session", SESSION_HEADER), ("state", STATE_HEADER), ("pin", PIN_HEADER)):
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
                f"unknown key(s) in cache: {', '.join(map(str, unknown))} (allowed: pin, session, state)",
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
    if session is None and (state is not None or pin):
        param = fields["state"][1] if state is not None else fields["pin"][1]
        raise CacheHintError(f"{param} needs a session (cache.session or {SESSION_HEADER})", param)
    return CacheHint(session=session, state=state, pin=pin if session is not None else None)


@dataclass(frozen=True)
class SessionStatus:
    """What the registry holds for one session (the answer of ``POST /cache/hint``)."""

    session: str
    state: CacheState | None
    pinned: bool
    known: bool

    def to_dict(self) -> dict:
        return {"session": self.session, "state": self.state, "pinned": self.pinned, "known": self.known}


@dataclass
class _Session:
    state: CacheState
    pinned: bool = False
    tips: weakref.WeakSet[RadixNode] = field(default_factory=weakref.WeakSet)


class SessionRegistry:
    """Latest lifecycle state per session, and which radix paths each touched.

    ``observe`` tags every node on the tip's path with the session name
    (``RadixNode.sessions``) so a policy can rank a node without walking
    sessions; the tree copies tags when it splits an edge.  Tips are held
    weakly: an evicted tip disappears from ``tips()`` without leaking its
    payload.  Pins are sticky: ``pin=True`` pins a session until a hint says
    ``pin: false``, or ``done`` without ``pin: true`` (a release), or it is
    forgotten.  ``done`` with ``pin: true`` keeps the pin: a finished turn on
    the branch a user is looking at.

    Threads: the engine thread observes requests and ranks nodes; ``apply``
    runs on the HTTP event loop, so a bare hint never waits for an engine
    step.  Writes and whole-registry reads hold a lock; the per-node reads
    eviction makes (``state``, ``is_pinned``) are single dict look-ups.
    """

    def __init__(self) -> None:
        self._sessions: dict[str, _Session] = {}
        self._lock = threading.RLock()

    def observe(self, hint: CacheHint, tip: RadixNode | None = None) -> None:
        """Record ``hint`` for its session; ``tip`` is the end of the radix path it used.

        A hint without a state means the session is active.  A new tip
        replaces the session's tips that are its ancestors (a conversation
        grows); tips on other branches are kept.
        """
        if hint.session is None:
            return
        with self._lock:
            self._observe(hint, tip)

    def _observe(self, hint: CacheHint, tip: RadixNode | None) -> None:
        info = self._sessions.get(hint.session)
        state: CacheState = hint.state or "active"
        if info is None:
            info = self._sessions[hint.session] = _Session(state)
        info.state = state
        if hint.pin is not None:
            info.pinned = hint.pin
        elif state == "done":
            info.pinned = False  # a release
        self._tag(hint.session, info, tip)

    def tag(self, session: str, tip: RadixNode) -> None:
        """Tag the path to ``tip`` with ``session`` and leave its state and pin as they are
        (KV written back to host for a session that already reported its state)."""
        with self._lock:
            info = self._sessions.get(session)
            if info is None:
                info = self._sessions[session] = _Session("active")
            self._tag(session, info, tip)

    @staticmethod
    def _tag(session: str, info: _Session, tip: RadixNode | None) -> None:
        if tip is not None and tip.attached and not tip.is_root:
            path = list(tip.iter_up())
            for node in path:
                node.sessions.add(session)
            on_path = set(map(id, path))
            for old in list(info.tips):
                if id(old) in on_path:
                    info.tips.discard(old)
            info.tips.add(tip)

    def apply(self, hint: CacheHint) -> SessionStatus:
        """Record a hint that came without a request (``POST /cache/hint``).

        It changes only what it names: without a state a known session keeps
        its state (an unknown one becomes active).  Releasing or unpinning a
        session the server never saw records nothing (``known`` is False), so
        hints about deleted branches cannot grow the registry.
        """
        if hint.session is None:
            raise CacheHintError("a hint needs a session (cache.session or X-Arbor-Session)", "session")
        with self._lock:
            info = self._sessions.get(hint.session)
            if info is None and not hint.pin and hint.state in (None, "done"):
                return SessionStatus(hint.session, None, False, known=False)
            state = hint.state or (info.state if info is not None else "active")
            pin = hint.pin
            if hint.state is None and pin is None and info is not None:
                pin = info.pinned  # a kept "done" must not read as a release
            self._observe(CacheHint(hint.session, state, pin), None)
            return self.status(hint.session)

    def status(self, session: str) -> SessionStatus:
        with self._lock:
            info = self._sessions.get(session)
            if info is None:
                return SessionStatus(session, None, False, known=False)
            return SessionStatus(session, info.state, info.pinned, known=True)

    def summary(self) -> dict:
        """Counts for /cache/stats: known sessions, pinned ones, sessions per state."""
        with self._lock:
            infos = list(self._sessions.values())
        by_state = dict.fromkeys(CACHE_STATES, 0)
        for info in infos:
            by_state[info.state] += 1
        return {"sessions": len(infos), "pinned": sum(i.pinned for i in infos), "by_state": by_state}

    def state(self, session: str) -> CacheState | None:
        info = self._sessions.get(session)
        return None if info is None else info.state

    def is_pinned(self, session: str) -> bool:
        info = self._sessions.get(session)
        return info is not None and info.pinned

    def tips(self, session: str) -> tuple[RadixNode, ...]:
        """The session's path tips still in the tree."""
        info = self._sessions.get(session)
        if info is None:
            return ()
        return tuple(sorted((t for t in info.tips if t.attached), key=lambda n: n.id))

    def sessions(self) -> tuple[str, ...]:
        with self._lock:
            return tuple(self._sessions)

    def states_of(self, node: RadixNode) -> tuple[CacheState, ...]:
        """States of the known sessions whose paths pass through ``node``."""
        return tuple(s for s in (self.state(name) for name in node.sessions) if s is not None)

    def is_node_pinned(self, node: RadixNode) -> bool:
        return any(self.is_pinned(name) for name in node.sessions)

    def forget(self, session: str, nodes: Iterable[RadixNode] = ()) -> None:
        """Drop a session and remove its tag from ``nodes`` (pass ``tree.nodes()``)."""
        with self._lock:
            self._sessions.pop(session, None)
        for node in nodes:
            node.sessions.discard(session)

    def forget_done(self, tree: RadixTree) -> int:
        """Forget every finished session (bounds the registry); return how many.

        Their nodes then rank as untagged (plain LRU) instead of "done first".
        """
        with self._lock:
            done = {name for name, info in self._sessions.items() if info.state == "done"}
            for name in done:
                del self._sessions[name]
        if done:
            for node in tree.nodes():
                node.sessions -= done
        return len(done)
