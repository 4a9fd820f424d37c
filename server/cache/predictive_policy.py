"""The predictive eviction policy (`--cache-policy predictive`, seed 003's BAYES_LIFECYCLE): a node
goes in the order of its value V_t(b), the expected reuse the lifecycle model predicts for the
sessions whose paths pass through it (server/cache/lifecycle_model.py), least valuable first,
least recently used first among equals. Pinned sessions' nodes are never taken (as with the
lifecycle policy); a node no session tags (requests without a session) is worth 0, so without
hints the order is LRU's.

Keys are computed at a time bucket of `resolution_s` (a quarter of the model's step) and the
model's version, so every key one eviction computes agrees; `epoch` names that bucket, and the
eviction queue (server/cache/eviction_queue.py) ranks its nodes again when it changes, since a
value may fall as well as rise with time (a session waiting past its expected return).

The policy also feeds the model what the server sees (`arrived`, `ended`, `hinted`) and finds
branch forks: a session's first prompt that runs through the node where another session's last
prompt ended continues that session (a branch forked from it), whose KV so came back.
"""

from __future__ import annotations

import math
import threading
from collections import OrderedDict
from collections.abc import Callable, Iterable, Sequence
from typing import TYPE_CHECKING

from server.cache.lifecycle_model import LifecycleModel

if TYPE_CHECKING:
    from server.cache.lifecycle import SessionRegistry
    from server.cache.radix_node import RadixNode

# values are rounded to this many significant digits in a key: nearer values are equals, ranked by LRU
KEY_DIGITS = 4
MAX_TIPS = 4096  # sessions whose last path is remembered for finding forks


class PredictivePolicy:
    name = "predictive"

    def __init__(self, model: LifecycleModel, registry: SessionRegistry | None = None,
                 clock: Callable[[], float] | None = None) -> None:
        self.model = model
        self.registry = registry
        self.clock = clock or model.clock
        self.resolution_s = model.params.step_s / 4
        self.tips = Tips()

    @property
    def epoch(self) -> tuple[int, int]:
        """The time bucket and the model's version the keys are computed at."""
        return (math.floor(self.clock() / self.resolution_s), self.model.version)

    def node_value(self, node: RadixNode) -> float:
        epoch = self.epoch
        value = self.model.values_at(epoch, epoch[0] * self.resolution_s)
        return sum(value(s) for s in tuple(node.sessions))

    def priority(self, node: RadixNode) -> tuple[float, float] | None:
        if self.registry is not None and self.registry.is_node_pinned(node):
            return None
        return (float(f"{self.node_value(node):.{KEY_DIGITS}g}"), node.last_access)

    def sessions_priority(self, sessions: Iterable[str], last_used: float) -> tuple[float, float] | None:
        """The key of something that `sessions` use and that was used last at `last_used` (a resident
        owner); None when one of them is pinned."""
        names = tuple(sessions)
        if self.registry is not None and any(self.registry.is_pinned(s) for s in names):
            return None
        epoch = self.epoch
        value = self.model.values_at(epoch, epoch[0] * self.resolution_s)
        return (float(f"{sum(value(s) for s in names):.{KEY_DIGITS}g}"), last_used)

    # ------------------------------------------------------------ events
    def arrived(self, session: str | None, tokens: Sequence[int]) -> None:
        """A request of `session` is admitted with the prompt `tokens` (its cache key)."""
        if session is None:
            return
        parents: tuple[str, ...] = ()
        if self.model.state(session) is None:
            parents = self.tips.parents(tokens, session)
        self.model.arrived(session, parents)

    def ended(self, session: str | None, hint_state: str | None, tokens: Sequence[int],
              tool: str | None = None) -> None:
        """A request of `session` ended with its hint's state (and the tool a tool wait waits on); `tokens`:
        what its KV holds."""
        if session is None:
            return
        self.model.ended(session, hint_state, tool=tool)
        self.tips.note(session, tokens)

    def hinted(self, session: str | None, hint_state: str | None, tool: str | None = None) -> None:
        if session is not None:
            self.model.hinted(session, hint_state, tool=tool)


_MOD = (1 << 61) - 1
_BASE = 1_000_003


class Tips:
    """Where each session's last request ended, as a path: its tokens less the last `TAIL` (the
    template's generation prompt, which the next prompt need not repeat token for token), hashed.
    A new session whose prompt starts with that path forked from the session."""

    TAIL = 16

    def __init__(self, max_sessions: int = MAX_TIPS) -> None:
        self._lock = threading.Lock()
        self.max_sessions = max_sessions
        self._tip: OrderedDict[str, tuple[int, int]] = OrderedDict()  # session -> (length, hash)
        self._at: dict[int, dict[int, set[str]]] = {}  # length -> hash -> sessions

    @staticmethod
    def _hash(tokens: Sequence[int], n: int) -> int:
        h = 0
        for t in tokens[:n]:
            h = (h * _BASE + t + 1) % _MOD
        return h

    def note(self, session: str, tokens: Sequence[int]) -> None:
        n = len(tokens) - self.TAIL
        if n <= 0:
            return
        key = (n, self._hash(tokens, n))
        with self._lock:
            self._drop(session)
            self._tip[session] = key
            self._at.setdefault(key[0], {}).setdefault(key[1], set()).add(session)
            while len(self._tip) > self.max_sessions:
                self._drop(next(iter(self._tip)))

    def _drop(self, session: str) -> None:
        old = self._tip.pop(session, None)
        if old is None:
            return
        by_hash = self._at[old[0]]
        by_hash[old[1]].discard(session)
        if not by_hash[old[1]]:
            del by_hash[old[1]]
            if not by_hash:
                del self._at[old[0]]

    def parents(self, tokens: Sequence[int], session: str) -> tuple[str, ...]:
        """Sessions other than `session` whose path `tokens` starts with."""
        with self._lock:
            lengths = sorted(n for n in self._at if n <= len(tokens))
            if not lengths:
                return ()
            found: set[str] = set()
            h, pos = 0, 0
            for n in lengths:
                for t in tokens[pos:n]:
                    h = (h * _BASE + t + 1) % _MOD
                pos = n
                found |= self._at[n].get(h, set())
            found.discard(session)
            return tuple(sorted(found))
