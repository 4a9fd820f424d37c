"""The lifecycle model's counts (server/cache/lifecycle_model.py): transitions between states and
how long each waiting state lasted, as log-spaced histograms, and the dwell curves the model
reads them through. Pure data; the priors file (lifecycle_priors.py) stores `Counts`."""

from __future__ import annotations

import bisect
import math
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

MODEL_CALL, TOOL_WAIT, COLLAB_WAIT, DONE = "model_call", "tool_wait", "collab_wait", "done"
STATES: tuple[str, ...] = (MODEL_CALL, TOOL_WAIT, COLLAB_WAIT, DONE)
WAITING: tuple[str, ...] = (TOOL_WAIT, COLLAB_WAIT, DONE)

# dwell-time histograms: log-spaced bins from 1 ms up, each 1.25x the one before (~100 bins to a day)
BIN_MIN_S = 1e-3
BIN_RATIO = 1.25
N_BINS = 100
KERNEL = (1 / 16, 4 / 16, 6 / 16, 4 / 16, 1 / 16)  # a dwell's share of its bin and the two on each side


def bin_of(seconds: float) -> int:
    if seconds <= BIN_MIN_S:
        return 0
    return min(N_BINS - 1, 1 + int(math.log(seconds / BIN_MIN_S, BIN_RATIO)))


def bin_upper(index: int) -> float:
    """The upper edge of a bin, seconds."""
    return BIN_MIN_S * BIN_RATIO ** index


class Dwell:
    """A histogram of how long a state lasted before one kind of exit; survival S(x) = P(T > x)."""

    def __init__(self, counts: Iterable[float] | None = None) -> None:
        self.counts = list(counts) if counts is not None else [0.0] * N_BINS
        if len(self.counts) != N_BINS:
            raise ValueError(f"a dwell histogram has {N_BINS} bins, got {len(self.counts)}")
        self._tail: list[float] | None = None  # tail[i] = mass in bins >= i

    def add(self, seconds: float, weight: float = 1.0) -> None:
        """Count one dwell, spread over its bin and the two on each side (a binomial kernel: a
        few samples give a smooth hazard, not one that jumps from bin to bin)."""
        centre = bin_of(seconds)
        for offset, share in zip(range(-2, 3), KERNEL):
            self.counts[min(N_BINS - 1, max(0, centre + offset))] += weight * share
        self._tail = None

    @property
    def total(self) -> float:
        return self._tails()[0]

    def _tails(self) -> list[float]:
        if self._tail is None:
            tail = [0.0] * (N_BINS + 1)
            for i in range(N_BINS - 1, -1, -1):
                tail[i] = tail[i + 1] + self.counts[i]
            self._tail = tail
        return self._tail

    def survival(self, seconds: float, prior: float = 0.0) -> float:
        """P(T > seconds), linear within a bin on the log scale; `prior` mass is spread evenly
        over the bins (the smoothing: no histogram is ever empty)."""
        tails = self._tails()
        per_bin = prior / N_BINS
        total = tails[0] + prior
        if total <= 0:
            return 1.0
        i = bin_of(seconds)
        lo = bin_upper(i - 1) if i > 0 else 0.0
        hi = bin_upper(i)
        if i == 0:
            frac = min(1.0, max(0.0, seconds / hi))
        else:
            frac = min(1.0, max(0.0, math.log(max(seconds, lo) / lo) / math.log(hi / lo)))
        above = tails[i + 1] + per_bin * (N_BINS - 1 - i)
        inside = (self.counts[i] + per_bin) * (1.0 - frac)
        return (above + inside) / total


class Curve:
    """One waiting state's dwell distribution as the model uses it: online and prior counts, and
    the smoothing mass `alpha` spread evenly over the bins up to `quiet_s` (a dwell beyond it is
    a session gone quiet). For returns it also knows when a session that has waited `e` is due.

    Due: a session is expected back at e + E[T - e | T > e]. A queue drains and a tool finishes,
    so waiting longer never puts that instant later: the model takes the earliest due instant
    seen at any elapsed time up to e (the *anchor*), and the mass that should have come back
    between the anchor and e counts as imminent (`LifecycleModel.session_value`).
    """

    EDGES: tuple[float, ...] = (0.0, *(bin_upper(i) for i in range(N_BINS)))

    def __init__(self, counts: list[float], smoothing: float, last_bin: int, stay: float = 0.0) -> None:
        """`stay`: mass that never leaves (the other exits' curve: a session that will not come back
        may wait on until it is found quiet)."""
        spread = smoothing / (last_bin + 1)
        self.dwell = Dwell(n + (spread if i <= last_bin else 0.0) for i, n in enumerate(counts))
        self.stay = stay
        self._table: tuple[list[float], list[float], list[tuple[float, float]]] | None = None

    def survival(self, seconds: float) -> float:
        if not self.stay:
            return self.dwell.survival(seconds)
        mass = self.dwell.total
        return (mass * self.dwell.survival(seconds) + self.stay) / (mass + self.stay)

    def _tables(self) -> tuple[list[float], list[float], list[tuple[float, float]]]:
        """Per edge: S, the integral of S beyond it, (the earliest due instant up to it, its anchor)."""
        if self._table is None:
            edges = self.EDGES
            surv = [self.survival(x) for x in edges]
            above = [0.0] * len(edges)
            for k in range(len(edges) - 2, -1, -1):
                above[k] = above[k + 1] + (edges[k + 1] - edges[k]) * (surv[k] + surv[k + 1]) / 2
            due: list[tuple[float, float]] = []
            best, anchor = math.inf, 0.0
            for x, sx, ax in zip(edges, surv, above):
                instant = x + ax / sx if sx > 0 else math.inf
                if instant < best:
                    best, anchor = instant, x
                due.append((best, anchor))
            self._table = (surv, above, due)
        return self._table

    def anchor(self, elapsed: float) -> float:
        """The elapsed time, at most `elapsed`, whose due instant is the earliest."""
        surv, above, due = self._tables()
        k = bisect.bisect_right(self.EDGES, elapsed) - 1  # the last edge at or before `elapsed`
        best, anchor = due[k]
        s = self.survival(elapsed)
        if s > 0 and k + 1 < len(self.EDGES):
            nxt = self.EDGES[k + 1]
            own = elapsed + ((nxt - elapsed) * (s + surv[k + 1]) / 2 + above[k + 1]) / s
            if own < best:
                return elapsed
        return anchor


@dataclass
class Counts:
    """Transition counts and dwell histograms, offline (priors) or online."""

    transitions: dict[str, dict[str, float]] = field(
        default_factory=lambda: {i: dict.fromkeys(STATES, 0.0) for i in STATES})
    returns: dict[str, Dwell] = field(default_factory=lambda: {s: Dwell() for s in WAITING})
    others: dict[str, Dwell] = field(default_factory=lambda: {s: Dwell() for s in WAITING})

    def to_dict(self) -> dict[str, Any]:
        return {"transitions": {i: {j: n for j, n in row.items() if n} for i, row in self.transitions.items()},
                "dwell_return": {s: d.counts for s, d in self.returns.items()},
                "dwell_other": {s: d.counts for s, d in self.others.items()}}

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Counts:
        counts = cls()
        for i, row in (data.get("transitions") or {}).items():
            for j, n in row.items():
                if i not in STATES or j not in STATES or not isinstance(n, (int, float)) or n < 0:
                    raise ValueError(f"bad transition count {i} -> {j}: {n!r}")
                counts.transitions[i][j] = float(n)
        for key, target in (("dwell_return", counts.returns), ("dwell_other", counts.others)):
            for s, bins in (data.get(key) or {}).items():
                if s not in WAITING:
                    raise ValueError(f"{key}: unknown waiting state {s!r}")
                if any(not isinstance(n, (int, float)) or n < 0 for n in bins):
                    raise ValueError(f"{key}.{s}: counts must be non-negative numbers")
                target[s] = Dwell(float(n) for n in bins)
        return counts


def merge(counts: Iterable[Counts]) -> Counts:
    """Sum several count sets (priors from several records)."""
    out = Counts()
    for c in counts:
        for i in STATES:
            for j in STATES:
                out.transitions[i][j] += c.transitions[i][j]
        for s in WAITING:
            for target, source in ((out.returns[s], c.returns[s]), (out.others[s], c.others[s])):
                target.counts = [a + b for a, b in zip(target.counts, source.counts)]
                target._tail = None
    return out
