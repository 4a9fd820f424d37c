"""Cache lifecycle hints: what a client tells the server about its session.

A hint (``CacheHint``) names a session, its state (active, tool_wait, done) and whether
it is pinned. Eviction uses them (``eviction.LifecyclePolicy``): a session waiting
on a tool stays warm, a finished one goes first, a pinned one stays.

A hint rides on a generation request (it takes effect when the request
ends), or comes alone through ``POST /cache/hint`` when nothing is generated
(a turn ended, a branch was deleted, the user opened another branch):
``SessionRegistry.apply`` takes those.

The API reads hints out of request bodies and headers (server.api.http.cache_fields);
``SessionRegistry`` remembers each session's latest state and its pin (a bounded number
of sessions), and tags the radix paths each touched.
"""

from __future__ import annotations

import itertools
import threading
import time
from collections import OrderedDict
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Literal, get_args

if TYPE_CHECKING:
    from server.cache.radix_node import RadixNode

CacheState = Literal["active", "tool_wait", "done"]
CACHE_STATES: tuple[str, ...] = get_args(CacheState)


@dataclass(frozen=True)
class CacheHint:
    """A validated lifecycle hint.  The empty hint (all defaults) means "no hint".

    ``pin``: True pins the session, False unpins it, None leaves its pin as it is.
    ``tool``: with state ``tool_wait``, the tool the session waits on (the predictive policy times the
    session's return by that tool's earlier returns).
    """

    session: str | None = None
    state: CacheState | None = None
    pin: bool | None = None
    tool: str | None = None

    @property
    def is_empty(self) -> bool:
        return self.session is None and self.state is None and self.pin is None


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
    seen: float = 0.0  # clock() at its latest hint
    pinned_at: int = 0  # order in which pins were set: the quotas release the oldest first


# A node shared by more sessions than this (a system prompt every session starts with) keeps
# the tags that matter for its rank (pinned and tool-waiting sessions) and drops the rest: its
# class is NORMAL or TOOL_WAIT either way, and the set cannot grow with every session seen.
MAX_NODE_SESSIONS = 64


class SessionRegistry:
    """Latest lifecycle state per session, bounded; which radix paths each touched.

    ``observe`` tags every node on the tip's path with the session name
    (``RadixNode.sessions``) so a policy can rank a node without walking
    sessions; the tree copies tags when it splits an edge.  Pins are sticky:
    ``pin=True`` pins a session until a hint says ``pin: false``, or ``done``
    without ``pin: true`` (a release), or it ages out.  ``done`` with
    ``pin: true`` keeps the pin: a finished turn on the branch a user is
    looking at.

    Bounded state: a session is forgotten when it sends no hint for
    ``idle_seconds``, when more than ``max_done`` finished ones are known (the
    oldest finished go first) and, past ``max_sessions``, the least recently
    seen goes.  A forgotten session's tags stay on nodes until they are pruned
    (a tag of an unknown session ranks nothing), and each node keeps at most
    ``MAX_NODE_SESSIONS`` tags.

    Quotas (pinned KV is never evicted, so one client could otherwise fill H
    and D and make every other store be declined): at most ``max_pinned``
    sessions are pinned at once, and the KV that pinned nodes hold stays under
    ``max_pinned_bytes``. A pin that would exceed either releases the oldest
    pins first (the session stays known, its state unchanged, its KV evictable
    again), counted in ``pins_released``. The session count is enforced when a
    pin is set; the bytes, which grow as pinned sessions store more KV, by
    ``enforce_pinned_bytes`` (the router calls it from the engine thread, at
    the step after a pin or a store changed them).

    Threads: the engine thread observes requests and ranks nodes; ``apply``
    runs on the HTTP event loop, so a bare hint never waits for an engine
    step.  Writes and whole-registry reads hold a lock; the per-node reads
    eviction makes (``state``, ``is_pinned``) are single dict look-ups.
    """

    def __init__(self, *, max_sessions: int = 4096, max_done: int = 256, idle_seconds: float = 3600.0,
                 max_pinned: int | None = None, max_pinned_bytes: int | None = None,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self._sessions: OrderedDict[str, _Session] = OrderedDict()  # least recently seen first
        self._done: OrderedDict[str, None] = OrderedDict()  # finished sessions, oldest first
        self._lock = threading.RLock()
        self.max_sessions = max_sessions
        self.max_done = max_done
        self.idle_seconds = idle_seconds
        self._clock = clock
        self.aged_out = 0  # sessions forgotten since start
        self.max_pinned = max_pinned  # None: no bound
        self.max_pinned_bytes = max_pinned_bytes  # None: no bound
        self._pin_order = itertools.count(1)
        self.pin_epoch = 0  # changes whenever a pin is set or dropped (the byte quota looks again then)
        self.pins_released = 0  # pins released by the quotas, oldest first
        self.pinned_bytes = 0  # KV bytes pinned nodes held at the last enforce_pinned_bytes
        self.n_pinned = 0  # sessions pinned now (a read without the lock: the router's fast path)
        # told of each bare hint `apply` records (the predictive policy's lifecycle model)
        self.on_apply: Callable[[CacheHint], None] | None = None

    def observe(self, hint: CacheHint, tip: RadixNode | None = None) -> None:
        """Record ``hint`` for its session; ``tip`` is the end of the radix path it used.
        A hint without a state means the session is active."""
        if hint.session is None:
            return
        with self._lock:
            self._observe(hint, tip)

    def _observe(self, hint: CacheHint, tip: RadixNode | None) -> None:
        session = hint.session
        assert session is not None  # observe() leaves out hints without one
        info = self._touch(session)
        state: CacheState = hint.state or "active"
        self._set_state(session, info, state)
        was = info.pinned
        if hint.pin is not None:
            info.pinned = hint.pin
        elif state == "done":
            info.pinned = False  # a release
        if info.pinned != was:
            self.pin_epoch += 1
            self.n_pinned += 1 if info.pinned else -1
        self._tag(session, tip)
        if info.pinned and not was:
            info.pinned_at = next(self._pin_order)
            self._enforce_pin_count()
        self._age_out()

    def _pinned_oldest_first(self) -> list[str]:
        return [name for _, name in sorted((i.pinned_at, n) for n, i in self._sessions.items() if i.pinned)]

    def _release_pin(self, session: str) -> None:
        """A quota takes a pin back (caller holds the lock)."""
        self._sessions[session].pinned = False
        self.pins_released += 1
        self.pin_epoch += 1
        self.n_pinned -= 1

    def _enforce_pin_count(self) -> None:
        """Release the oldest pins while more than ``max_pinned`` sessions are pinned (caller
        holds the lock); with ``max_pinned`` 0 a new pin is released at once."""
        if self.max_pinned is None:
            return
        pinned = self._pinned_oldest_first()
        for name in pinned[:max(0, len(pinned) - self.max_pinned)]:
            self._release_pin(name)

    def enforce_pinned_bytes(self, nodes: Iterable[RadixNode], nbytes: Callable[[RadixNode], int]) -> int:
        """Release the oldest pins until the KV that pinned nodes hold (``nbytes(node)`` summed
        over the nodes some pinned session tags, each node once) fits ``max_pinned_bytes``;
        returns the pinned bytes after. Caller holds the tree's mutex (the walk reads tags)."""
        with self._lock:
            pinned = self._pinned_oldest_first()
            if not pinned:
                self.pinned_bytes = 0
                return 0
            rank = {name: i for i, name in enumerate(pinned)}
            # per node: its bytes and the pins protecting it (a node stays pinned while any is left)
            held: list[tuple[int, list[int]]] = []
            total = 0
            for node in nodes:
                pins = [rank[s] for s in tuple(node.sessions) if s in rank]
                if pins:
                    b = nbytes(node)
                    held.append((b, pins))
                    total += b
            if self.max_pinned_bytes is not None and total > self.max_pinned_bytes:
                # Oldest first: a node is unprotected once its newest pin is released, so its
                # bytes come off the total at that release.
                freed_by = [0] * len(pinned)
                for b, pins in held:
                    freed_by[max(pins)] += b
                k = 0
                while total > self.max_pinned_bytes and k < len(pinned):
                    self._release_pin(pinned[k])
                    total -= freed_by[k]
                    k += 1
            self.pinned_bytes = total
            return total

    def _touch(self, session: str) -> _Session:
        info = self._sessions.get(session)
        if info is None:
            info = self._sessions[session] = _Session("active")
        info.seen = self._clock()
        self._sessions.move_to_end(session)
        return info

    def _set_state(self, session: str, info: _Session, state: CacheState) -> None:
        info.state = state
        if state == "done":
            self._done[session] = None
            self._done.move_to_end(session)
        else:
            self._done.pop(session, None)

    def _age_out(self) -> None:
        """Forget idle sessions, the oldest finished ones past ``max_done``, and the least
        recently seen past ``max_sessions`` (caller holds the lock)."""
        horizon = self._clock() - self.idle_seconds
        while self._sessions:
            name, info = next(iter(self._sessions.items()))
            if info.seen >= horizon and len(self._sessions) <= self.max_sessions:
                break
            self._forget(name)
        while len(self._done) > self.max_done:
            self._forget(next(iter(self._done)))

    def _forget(self, session: str) -> None:
        info = self._sessions.pop(session, None)
        if info is not None and info.pinned:
            self.pin_epoch += 1
            self.n_pinned -= 1
        self._done.pop(session, None)
        self.aged_out += 1

    def tag(self, session: str, tip: RadixNode) -> None:
        """Tag the path to ``tip`` with ``session`` and leave its state and pin as they are
        (KV written back to host for a session that already reported its state)."""
        with self._lock:
            if session not in self._sessions:
                self._touch(session)
            self._tag(session, tip)
            self._age_out()

    def _tag(self, session: str, tip: RadixNode | None) -> None:
        if tip is None or not tip.attached or tip.is_root:
            return
        for node in tip.iter_up():
            if session in node.sessions:
                continue
            if len(node.sessions) >= MAX_NODE_SESSIONS:
                self._prune_tags(node)
                if len(node.sessions) >= MAX_NODE_SESSIONS and not self._ranks(session):
                    continue  # a crowded node: an active or finished session changes nothing of its rank
            node.sessions.add(session)

    def _ranks(self, session: str) -> bool:
        info = self._sessions.get(session)
        return info is not None and (info.pinned or info.state == "tool_wait")

    def _prune_tags(self, node: RadixNode) -> None:
        """Drop a crowded node's tags of forgotten sessions, then those that do not rank it."""
        node.sessions -= {name for name in node.sessions if name not in self._sessions}
        if len(node.sessions) >= MAX_NODE_SESSIONS:
            node.sessions -= {name for name in node.sessions if not self._ranks(name)}

    def apply(self, hint: CacheHint) -> SessionStatus:
        """Record a hint that came without a request (``POST /cache/hint``).

        It changes only what it names: without a state a known session keeps
        its state (an unknown one becomes active).  Releasing or unpinning a
        session the server never saw records nothing (``known`` is False), so
        hints about deleted branches cannot grow the registry.
        """
        if hint.session is None:
            raise ValueError("a hint needs a session")  # the API refuses such a hint before it comes here
        with self._lock:
            info = self._sessions.get(hint.session)
            if info is None and not hint.pin and hint.state in (None, "done"):
                return SessionStatus(hint.session, None, False, known=False)
            state = hint.state or (info.state if info is not None else "active")
            pin = hint.pin
            if hint.state is None and pin is None and info is not None:
                pin = info.pinned  # a kept "done" must not read as a release
            self._observe(CacheHint(hint.session, state, pin), None)
            status = self.status(hint.session)
        if self.on_apply is not None:
            self.on_apply(hint)
        return status

    def status(self, session: str) -> SessionStatus:
        with self._lock:
            info = self._sessions.get(session)
            if info is None:
                return SessionStatus(session, None, False, known=False)
            return SessionStatus(session, info.state, info.pinned, known=True)

    def summary(self) -> dict:
        """For /cache/stats and the metrics: known sessions (and the bound), pinned ones,
        sessions per state, sessions forgotten since start."""
        with self._lock:
            infos = list(self._sessions.values())
            aged_out = self.aged_out
        by_state = dict.fromkeys(CACHE_STATES, 0)
        for info in infos:
            by_state[info.state] += 1
        return {"sessions": len(infos), "max_sessions": self.max_sessions, "pinned": sum(i.pinned for i in infos),
                "max_pinned": self.max_pinned, "pinned_bytes": self.pinned_bytes,
                "max_pinned_bytes": self.max_pinned_bytes, "pins_released": self.pins_released,
                "by_state": by_state, "aged_out": aged_out}

    def state(self, session: str) -> CacheState | None:
        info = self._sessions.get(session)
        return None if info is None else info.state

    def is_pinned(self, session: str) -> bool:
        info = self._sessions.get(session)
        return info is not None and info.pinned

    def states_of(self, node: RadixNode) -> tuple[CacheState, ...]:
        """States of the known sessions whose paths pass through ``node``."""
        return tuple(s for s in (self.state(name) for name in tuple(node.sessions)) if s is not None)

    def is_node_pinned(self, node: RadixNode) -> bool:
        return any(self.is_pinned(name) for name in tuple(node.sessions))
