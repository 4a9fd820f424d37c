"""Comparing two greedy answers of the real model that were computed in different batch shapes.

Reused KV is computed in other shapes than a fresh prefill (a prefix restored or kept, the rest
in another chunk; cells in another order), and llama.cpp's sums (F16 accumulators, activations
quantized for the Q4_1 weights, per batch size) then differ in their last bits. Where two
candidates are nearly tied, the greedy choice can flip, and every later token follows it. So two
such answers are "the same" when they are equal, or part at a near-tie: at the first different
token, each run's own log-probabilities put the other run's choice within NEAR_TIE_NATS of its
own. A wrong computation (another prompt's cells, a wrong position, stale bytes) moves the
distribution itself: its first different choice is not between two near-equal candidates
(tests/server/cache/test_router_real.py's control flags the answer to another question 6/6).

The rule alone has no power against a small error: a restored segment shifted by one position or
one stale cell moves the embedded model's log-probabilities by about as much as another chunking
does (both up to ~0.6 nats on its Q4_1 weights), so such an error shows only as more partings.
Hence a bound on how often answers part (PARTING_RATE, measured by
tests/server/cache/test_parting_rate.py over many pairs and recorded in docs/benchmark-notes.md,
"Near-tie partings"), and the planted-fault controls on a float32 model whose log-probabilities
move by ~1e-2 between chunkings and ~1e-1 with such a fault (tests/server/cache/test_cache_faults_real.py).
"""

from __future__ import annotations

import math
from collections.abc import Hashable, Mapping, Sequence
from dataclasses import dataclass

# On the embedded model the first different choice of 400 cache-on / cache-off pairs was between
# candidates up to 0.32 nats apart (43 parted, 37 of them under 0.2): 0.5 leaves room for that.
# Lowering it would not flag the errors above: their partings are at 0.1 to 0.6 nats too.
NEAR_TIE_NATS = 0.5

# How often a cache-on answer of 6 tokens parts from the cache-off one on the embedded model
# (tests/server/cache/test_router_real.py's 50 prompts, the defaults' paged attention and owned
# pages, drafting off): test_parting_rate.py measured 43 of 400 (0.107), 11 at the first token
# (0.028); the rates below are the upper ends of their 95% intervals (docs/benchmark-notes.md,
# "Near-tie partings"). A run of n answers may part at most parting_bound(n) times: the count
# a run at that rate exceeds less than once in 1/PARTING_TAIL runs.
PARTING_RATE = 0.14
FIRST_TOKEN_PARTING_RATE = 0.05  # partings at the answer's first token
PARTING_TAIL = 1e-3


def parting_bound(n: int, rate: float = PARTING_RATE, tail: float = PARTING_TAIL) -> int:
    """The fewest partings k of n answers with P(more than k) < tail when each parts at `rate`."""
    below = 0.0
    for k in range(n + 1):
        below += math.comb(n, k) * rate**k * (1 - rate) ** (n - k)
        if 1.0 - below < tail:
            return k
    return n


@dataclass(frozen=True)
class Step:
    """One generated token: its log-probability and the most likely ones at its position."""

    token: Hashable  # a token id, or its text where an API reports text
    logprob: float
    top: Mapping[Hashable, float]


def first_parting(a: Sequence[Hashable], b: Sequence[Hashable]) -> int | None:
    """The first index where two token lists differ (the shorter one's length when one is the
    other's prefix); None when they are equal."""
    if list(a) == list(b):
        return None
    return next((i for i, (x, y) in enumerate(zip(a, b)) if x != y), min(len(a), len(b)))


def gap(step: Step, other: Hashable | None) -> float:
    """How far below `step`'s own choice its run put `other` (inf when not among its top)."""
    alt = step.top.get(other) if other is not None else None
    return float("inf") if alt is None else step.logprob - alt


def parting_problem(a: Sequence[Step], b: Sequence[Step]) -> str | None:
    """None when the two answers are equal or part at a near-tie; else what differs. An answer
    that ends where the other goes on is a problem here (the API's rows do not show the end
    token's probability); engine_harness.divergence handles that case with the model's EOG test."""
    i = first_parting([s.token for s in a], [s.token for s in b])
    if i is None:
        return None
    if i >= len(a) or i >= len(b):
        return f"one answer ends at token {i}, the other goes on: {[s.token for s in a]} vs {[s.token for s in b]}"
    worst = max(gap(a[i], b[i].token), gap(b[i], a[i].token))
    if worst <= NEAR_TIE_NATS:
        return None
    return (f"answers differ at token {i} by {worst:.3f} nats (a near-tie is <= {NEAR_TIE_NATS}): "
            f"{[s.token for s in a]} vs {[s.token for s in b]}")


def chat_steps(choice) -> list[Step]:
    """A chat completion choice's tokens (asked with logprobs and top_logprobs) as Steps."""
    return [Step(e.token, e.logprob, {t.token: t.logprob for t in e.top_logprobs}) for e in choice.logprobs.content]


def completion_steps(choice) -> list[Step]:
    """A legacy completion choice's tokens (asked with `logprobs=k`) as Steps."""
    lp = choice.logprobs
    return [Step(t, p, top) for t, p, top in zip(lp.tokens, lp.token_logprobs, lp.top_logprobs)]
