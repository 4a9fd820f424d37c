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
"""

from __future__ import annotations

from collections.abc import Hashable, Mapping, Sequence
from dataclasses import dataclass

# On the embedded model the first different choice of 50 cache-on / cache-off pairs was between
# candidates up to 0.18 nats apart (6 of 50 parted, most under 0.11): 0.5 leaves room for that.
NEAR_TIE_NATS = 0.5


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
