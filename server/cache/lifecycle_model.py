"""Seed 003's lifecycle model: which sessions will call the model again, and how soon.

A session (a client's `cache.session` / `prompt_cache_key`, one per workbench branch) is in one of
four states, seed 003's: `model_call` (a request of it is running), `tool_wait` (its tools run),
`collab_wait` (it goes on after someone else: the user, another agent; a hint `active` or no
state), `done` (its turn ended). What the server sees moves it between them: a request's arrival
(-> model_call), a request's end with its hint's state, a bare hint (POST /cache/hint), a branch
fork (a new session's first prompt continues another session's path: that session's KV came back
as much as if it had called), and a session gone quiet (waiting for `quiet_s` with no call: it
leaves for `done`, or, already done, stays there for good).

Transitions are counted (seed 003, 4.1):

    P_t(s_j | s_i) = (alpha + N_ij^off + N_ij^on(t)) / sum_k (alpha + N_ik^off + N_ik^on(t))

`N^off` from a priors file (server/cache/lifecycle_priors.py, built from recorded runs), `N^on`
online, `alpha` the smoothing prior. The seed's Markov chain steps are events, not time; a cache
must know *when* a waiting session comes back, so the model is semi-Markov: each waiting state
also keeps the times it lasted before a return and before any other exit (log-spaced histograms,
priors plus online). A block's value is seed 003's

    V_t(b) = sum_{h=1..H} gamma^(h-1) sum_s P(s_{t+h} = s | H_t) R(b, s)

with steps of `step_s` seconds, R(b, s) = 1 for s = model_call and each session whose path
passes through b (a session's call reuses its whole path; a node's value sums its sessions'),
0 otherwise, and P(s_{t+h} = model_call | H_t) the chance that the session's call comes in step h
given its state and how long it has waited, e. With p = P(model_call | state), S_r and S_o the
survival functions of the return and the other dwell times (lifecycle_counts.Curve):

    P(return in step h) = c(e) * (S_r(max(a, e + (h-1) step)) - S_r(e + h step)) / S_r(a),
    c(e) = p S_r(e) / (p S_r(e) + (1 - p) S_o(e))   (the chance it comes back at all),

where a <= e is the *due anchor*: the elapsed time whose expected return instant,
a + E[T - a | T > a], is the earliest. A queue drains and a tool finishes, so waiting longer
never makes a session due later: what should have come back since the anchor counts as
imminent (step 1). So a session whose tool is about to return, or is overdue, outranks one that
just left; a session waiting far past every return seen fades with c(e). A tool or collaboration
wait whose state has shown fewer than `MIN_RETURNS` returns is timed by the two states' returns
pooled (a fork point before its first branches come: without this, every session in a kind of wait
not yet seen to end was worth 0 and lost its KV before any timed one; issue 58's fork misses). A
finished session whose state has shown fewer than `MIN_RETURNS` returns, and any session before
`MIN_RETURNS` returns in all, is not timed and worth 0 (its nodes go in LRU order, as without
hints). The value only orders eviction (server/cache/predictive_policy.py).

Pure and thread-safe (one lock); the clock is injected, so the simulator (bench/cachesim/) runs
it on virtual time.
"""

from __future__ import annotations

import threading
import time
from collections import OrderedDict
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

from server.cache.lifecycle_counts import (
    COLLAB_WAIT,
    DONE,
    MODEL_CALL,
    STATES,
    TOOL_WAIT,
    WAITING,
    Counts,
    Curve,
    Dwell,
    bin_of,
)

__all__ = ["COLLAB_WAIT", "DONE", "HINT_STATE", "MODEL_CALL", "STATES", "TOOL_WAIT", "WAITING", "Counts",
           "LifecycleModel", "ModelParams", "hint_prior"]

# a hint's state (server/cache/lifecycle.py) -> the state it puts the session in when it takes effect
HINT_STATE = {"active": COLLAB_WAIT, "tool_wait": TOOL_WAIT, "done": DONE}

MIN_RETURNS = 4  # returns a waiting state (or a tool) must have shown before its sessions' return is timed by them
ANY_WAIT = "any_wait"  # the pooled returns of the waits that go on (LifecycleModel._timing)
CONTINUING = (TOOL_WAIT, COLLAB_WAIT)  # the waits a client says its session goes on after
MAX_TOOLS = 256  # tools whose return times are kept (the least recently returned go first)


@dataclass(frozen=True)
class ModelParams:
    """The model's settings (arbor-server's --cache-predict-*; defaults chosen by bench.cache_sim,
    docs/benchmark-notes.md)."""

    alpha: float = 1.0  # smoothing pseudo-count per transition, and the dwell curves' smoothing mass
    horizon: int = 8  # H: steps looked ahead
    step_s: float = 0.25  # a step's length, seconds
    gamma: float = 0.5  # decay per step
    quiet_s: float = 600.0  # a waiting session with no call for this long has gone quiet

    def __post_init__(self) -> None:
        if self.alpha <= 0 or self.horizon < 1 or self.step_s <= 0 or not 0 < self.gamma <= 1 or self.quiet_s <= 0:
            raise ValueError(f"invalid lifecycle model parameters: {self}")


@dataclass
class _Session:
    state: str
    since: float  # when it entered `state`
    running: int = 0  # its requests in flight
    forked: bool = False  # a branch forked from it in this wait (one return counted per wait)
    tool: str | None = None  # in a tool wait: the tool it waits on, when its hint named one


# What the hints mean, as pseudo-counts: the prior without a priors file. A tool wait comes back,
# a collaboration wait mostly does, a finished session mostly does not (the lifecycle classes'
# order, server/cache/eviction.py); a few counts, so the first real transitions outweigh them.
HINT_PRIOR = {TOOL_WAIT: {MODEL_CALL: 4.0}, COLLAB_WAIT: {MODEL_CALL: 2.0, DONE: 1.0}, DONE: {DONE: 4.0}}


def hint_prior() -> Counts:
    counts = Counts()
    for i, row in HINT_PRIOR.items():
        counts.transitions[i].update(row)
    return counts


class LifecycleModel:
    """Per-session states from the server's events, transition counts and dwell times (priors
    plus online), and each session's value (module docstring)."""

    def __init__(self, params: ModelParams | None = None, priors: Counts | None = None,
                 clock: Callable[[], float] = time.monotonic, max_sessions: int = 4096) -> None:
        self.params = params or ModelParams()
        self.prior = priors if priors is not None else hint_prior()
        self.online = Counts()
        self.clock = clock
        self.max_sessions = max_sessions
        self._sessions: OrderedDict[str, _Session] = OrderedDict()  # least recently changed first
        self._lock = threading.RLock()
        self.version = 0  # changes with every state change or count (values computed before may be stale)
        self.forks = 0
        self.quiet = 0
        self._values: dict[str, float] = {}
        self._values_at: tuple[int, int] | None = None
        self._curves: dict[tuple[str, str], tuple[int, Curve]] = {}
        # a tool's return times (online only: the priors are per state), for the sessions whose hint names it
        self.tool_returns: OrderedDict[str, Dwell] = OrderedDict()

    # ------------------------------------------------------------ events
    def arrived(self, session: str, parents: Iterable[str] = (), now: float | None = None) -> None:
        """A request of `session` arrives; `parents`: other sessions whose path its prompt
        continues, when the session is new (a branch forked from them)."""
        with self._lock:
            now = self.clock() if now is None else now
            self._sweep(now)
            info = self._sessions.get(session)
            if info is None:
                for parent in parents:
                    self._fork(parent, now)
                info = self._sessions[session] = _Session(MODEL_CALL, now)  # a new session enters by its call
            elif info.state != MODEL_CALL:
                self._leave(info, MODEL_CALL, now)
            info.running += 1
            self._sessions.move_to_end(session)
            self._bound()
            self.version += 1

    def ended(self, session: str, hint_state: str | None, now: float | None = None, tool: str | None = None) -> None:
        """A request of `session` ended; `hint_state` its hint's state (None: active); `tool`: the tool a
        tool wait waits on, when the hint names one (its return is then timed by that tool's returns)."""
        with self._lock:
            now = self.clock() if now is None else now
            info = self._sessions.get(session)
            if info is None:
                return
            info.running = max(0, info.running - 1)
            if info.running == 0:
                self._leave(info, HINT_STATE.get(hint_state or "active", COLLAB_WAIT), now)
                info.tool = tool if info.state == TOOL_WAIT else None
            self.version += 1

    def hinted(self, session: str, hint_state: str | None, now: float | None = None, tool: str | None = None) -> None:
        """A bare hint (no request): a known, idle session moves to its state; a tool wait's hint may name
        the tool it waits on (named again in the same wait, it changes the tool, not when the wait began)."""
        with self._lock:
            now = self.clock() if now is None else now
            info = self._sessions.get(session)
            if info is None or info.running or hint_state is None:
                return
            target = HINT_STATE.get(hint_state)
            if target is not None and target != info.state:
                self._leave(info, target, now)
                self.version += 1
            if target == TOOL_WAIT and tool is not None and tool != info.tool:
                info.tool = tool
                self.version += 1

    def forget(self, session: str) -> None:
        with self._lock:
            self._sessions.pop(session, None)
            self.version += 1

    def finish(self, now: float | None = None) -> None:
        """The record ends (building priors from a trace): every waiting session counts as never
        coming back, after what it waited so far."""
        with self._lock:
            now = self.clock() if now is None else now
            for info in self._sessions.values():
                if info.state in WAITING and not info.forked:
                    self.online.others[info.state].add(now - info.since)
                    self._count(info.state, DONE)
            self._sessions.clear()
            self.version += 1

    def _fork(self, parent: str, now: float) -> None:
        """A new session continues `parent`'s path: its KV came back, counted as a return of its
        wait (once per wait: the branches of one fork point arrive together); it waits on."""
        info = self._sessions.get(parent)
        if info is None or info.state not in WAITING:
            return
        self.forks += 1
        if not info.forked:
            info.forked = True
            self._returned(info, now)
            self._count(info.state, MODEL_CALL)

    def _leave(self, info: _Session, target: str, now: float) -> None:
        old = info.state
        if old in WAITING and not info.forked:  # (a forked wait's return is counted)
            if target == MODEL_CALL:
                self._returned(info, now)
            else:
                self.online.others[old].add(now - info.since)
            self._count(old, target)
        elif old not in WAITING:
            self._count(old, target)
        info.state, info.since, info.forked, info.tool = target, now, False, None

    def _returned(self, info: _Session, now: float) -> None:
        """A waiting session's KV came back (its call, or a branch's fork): the wait's time, for its state and
        for the tool it waited on."""
        self.online.returns[info.state].add(now - info.since)
        if info.tool is not None:
            dwell = self.tool_returns.pop(info.tool, None) or Dwell()
            dwell.add(now - info.since)
            self.tool_returns[info.tool] = dwell  # the most recently returned last
            while len(self.tool_returns) > MAX_TOOLS:  # tool names are the clients': their number is bounded here
                gone, _ = self.tool_returns.popitem(last=False)
                self._curves.pop(("returns", f"{TOOL_WAIT}:{gone}"), None)

    def _count(self, i: str, j: str) -> None:
        self.online.transitions[i][j] += 1.0

    def _sweep(self, now: float) -> None:
        """Sessions waiting past `quiet_s` go quiet: to done, or (done already) for good."""
        limit = self.params.quiet_s
        for name, info in list(self._sessions.items()):
            if info.state in WAITING and info.running == 0 and now - info.since >= limit:
                if not info.forked:
                    self.online.others[info.state].add(now - info.since)
                    self._count(info.state, DONE)
                self.quiet += 1
                if info.state == DONE:
                    del self._sessions[name]  # gone for good: nothing left to predict
                else:
                    info.state, info.since, info.forked = DONE, now, False

    def _bound(self) -> None:
        while len(self._sessions) > self.max_sessions:
            self._sessions.popitem(last=False)

    # ------------------------------------------------------------ predictions
    def transition_p(self, i: str, j: str) -> float:
        alpha = self.params.alpha
        row = [alpha + self.prior.transitions[i][k] + self.online.transitions[i][k] for k in STATES]
        return row[STATES.index(j)] / sum(row)

    def return_p(self, state: str) -> float:
        """P(model_call | state): the chance a waiting state ends in a call (not in another wait)."""
        return self.transition_p(state, MODEL_CALL)

    def _returns_seen(self, state: str) -> float:
        return self.online.returns[state].total + self.prior.returns[state].total

    def _timing(self, state: str, tool: str | None) -> str | None:
        """Whose return times time a session waiting in `state` (on `tool`, when that tool is timed): the state's
        own once it has shown MIN_RETURNS returns; else, for a wait the client says goes on (tool, collaboration),
        the pooled returns of those waits (`ANY_WAIT`: a kind of wait not seen to end yet is expected back like the
        waits seen so far, so its sessions are not all evicted before the timed ones); else None (not timed: a
        finished session's return is the exception, and it is not expected back before its state has shown it)."""
        if tool is not None or self._returns_seen(state) >= MIN_RETURNS:
            return state
        if state in CONTINUING and sum(self._returns_seen(s) for s in CONTINUING) >= MIN_RETURNS:
            return ANY_WAIT
        return None

    def curve(self, kind: str, state: str, tool: str | None = None) -> Curve:
        """The `returns` or `others` dwell curve of a waiting state (`ANY_WAIT`: the returns of every waiting
        state pooled), or (`tool`) the returns of the tool waits on that tool (cached per model version)."""
        key = (kind, state if tool is None else f"{state}:{tool}")
        cached = self._curves.get(key)
        if cached is not None and cached[0] == self.version:
            return cached[1]
        if tool is not None:
            counts = list(self.tool_returns[tool].counts)
        elif state == ANY_WAIT:
            pooled = [getattr(c, kind)[s].counts for c in (self.online, self.prior) for s in CONTINUING]
            counts = [sum(col) for col in zip(*pooled)]
        else:
            on, off = getattr(self.online, kind)[state], getattr(self.prior, kind)[state]
            counts = [a + b for a, b in zip(on.counts, off.counts)]
        if kind == "returns":  # smoothed over the bins up to quiet_s
            curve = Curve(counts, self.params.alpha, bin_of(self.params.quiet_s))
        else:  # with `alpha` of sessions that never leave by themselves (until found quiet)
            curve = Curve(counts, 0.0, 0, stay=self.params.alpha)
        self._curves[key] = (self.version, curve)
        return curve

    def session_value(self, session: str, now: float | None = None) -> float:
        """V: the discounted chance of the session's next call in each step of the horizon
        (module docstring), from its due anchor (`Curve`); a running session's is 1."""
        with self._lock:
            info = self._sessions.get(session)
            if info is None:
                return 0.0
            if info.state == MODEL_CALL or info.running:
                return 1.0
            now = self.clock() if now is None else now
            e = max(0.0, now - info.since)
            p = self.return_p(info.state)
            step, gamma = self.params.step_s, self.params.gamma
            timed = self.tool_returns.get(info.tool) if info.state == TOOL_WAIT and info.tool is not None else None
            tool = info.tool if timed is not None and timed.total >= MIN_RETURNS else None  # its tool's, once known
            timing = self._timing(info.state, tool)
            if timing is None:
                return 0.0  # no return seen yet, so no time to expect one at (LRU orders these sessions)
            returns, others = self.curve("returns", timing, tool), self.curve("others", info.state)
            sr, so = returns.survival(e), others.survival(e)
            z = p * sr + (1.0 - p) * so
            anchor_s = returns.survival(returns.anchor(e))
            if z <= 0 or anchor_s <= 0:
                return 0.0
            comes_back = p * sr / z  # the chance it calls again at all, having waited e
            value, before = 0.0, anchor_s  # what should have come back since the anchor is imminent
            for h in range(1, self.params.horizon + 1):
                after = returns.survival(e + h * step)
                value += gamma ** (h - 1) * max(0.0, before - after)
                before = after
            return comes_back * value / anchor_s

    def values_at(self, epoch: tuple[int, int], now: float) -> Callable[[str], float]:
        """Session values memoized for one `epoch` (the policy's time bucket and the model's
        version): every key computed within it agrees."""
        with self._lock:
            if self._values_at != epoch:
                self._values, self._values_at = {}, epoch
            values = self._values

        def value(session: str) -> float:
            v = values.get(session)
            if v is None:
                v = values[session] = self.session_value(session, now)
            return v
        return value

    def state(self, session: str) -> str | None:
        info = self._sessions.get(session)
        return None if info is None else info.state

    def forked(self, session: str) -> bool:
        """Whether a branch forked from the session in its present wait (its KV came back through the branch)."""
        info = self._sessions.get(session)
        return info is not None and info.forked

    def summary(self) -> dict[str, Any]:
        """For /cache/stats: sessions per state, online transitions, P(model_call | state)."""
        with self._lock:
            by_state = dict.fromkeys(STATES, 0)
            for info in self._sessions.values():
                by_state[info.state] += 1
            return {
                "sessions": len(self._sessions), "by_state": by_state, "forks": self.forks, "quiet": self.quiet,
                "transitions_online": {i: {j: int(n) for j, n in row.items() if n}
                                       for i, row in self.online.transitions.items() if any(row.values())},
                "transitions_prior": int(sum(sum(row.values()) for row in self.prior.transitions.values())),
                "return_p": {s: round(self.return_p(s), 4) for s in WAITING},
                "tools_timed": sum(1 for d in self.tool_returns.values() if d.total >= MIN_RETURNS),
                "params": {"alpha": self.params.alpha, "horizon": self.params.horizon, "step_s": self.params.step_s,
                           "gamma": self.params.gamma, "quiet_s": self.params.quiet_s},
            }
