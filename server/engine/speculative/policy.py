"""When a draft pays, and how long it should be: the adaptive policy of speculative decoding. Pure logic.

A draft of k tokens costs k more rows in the step that verifies it; it gains the tokens the target accepts. The
policy keeps two measurements:

- the step's cost by rows, t(n) = base + per_row * n, fitted online (exponentially weighted least squares over
  the steps' rows and seconds, the verification's sampling included) to what this machine and model really
  cost: on a CPU rows are not free, and under load the batch is already wide;
- per sequence, the chance p that a drafted token is accepted when the one before it was, from the tokens its
  own drafts had tested (old ones fading, so a sequence that starts copying text is seen within a few tokens),
  starting from the same chance over every sequence's recent drafts. A sequence the drafter had nothing for
  several steps in a row (free text: no n-gram repeats) is asked every few steps only, since every ask costs a
  lookup.

The step's tokens per second go up with a sequence's j-th draft token when what it is expected to bring, p^j
(it is accepted only if every token before it was), outweighs what its row costs every decoding sequence:
p^j * t(n) > D * (per_row + drafting), with n the step's rows and D its decoding sequences. So a sequence drafts
k = the largest such j tokens (at most what its request and the drafter allow), fewer when the batch is wide or
its acceptance low, none when even one token does not pay; such a sequence still tries a one-token draft once
`probe_every` steps have passed without one (at every step until the drafter has one to test), so its estimate
can recover. The step cost is fitted from decode steps only: a prompt chunk's rows cost what compute-bound
prefill costs, not what one more row of a memory-bound decode step does. Not adaptive (`adaptive=False`):
every sequence drafts the most it may, as llama-server does.
"""

from __future__ import annotations

import math
from dataclasses import dataclass


@dataclass
class StepCost:
    """Step seconds as base + per_row * rows, fitted with exponential forgetting."""

    decay: float = 0.98
    prior_per_row_share: float = 0.05  # per_row / base until rows vary enough to tell (memory-bound decode)
    _w: float = 0.0
    _sx: float = 0.0
    _sy: float = 0.0
    _sxx: float = 0.0
    _sxy: float = 0.0

    def observe(self, rows: int, seconds: float) -> None:
        if rows <= 0 or seconds <= 0:
            return
        d = self.decay
        self._w = self._w * d + 1.0
        self._sx = self._sx * d + rows
        self._sy = self._sy * d + seconds
        self._sxx = self._sxx * d + rows * rows
        self._sxy = self._sxy * d + rows * seconds

    @property
    def known(self) -> bool:
        return self._w > 0

    def fit(self) -> tuple[float, float]:
        """(base, per_row) in seconds; (0, 0) before any step."""
        if self._w <= 0:
            return 0.0, 0.0
        mx, my = self._sx / self._w, self._sy / self._w
        var = self._sxx / self._w - mx * mx
        prior_base = my / (1.0 + self.prior_per_row_share * mx)
        prior_row = prior_base * self.prior_per_row_share
        if var < 1.0:  # every step had about the same rows: the slope is not seen yet
            return prior_base, prior_row
        slope = (self._sxy / self._w - mx * my) / var
        # a little of the prior keeps a noisy fit from a slope of zero (or below): rows are never free
        slope = max(slope, 0.25 * prior_row)
        base = max(my - slope * mx, 0.1 * my)
        return base, slope

    def seconds(self, rows: int) -> float:
        base, per_row = self.fit()
        return base + per_row * rows


@dataclass
class Acceptance:
    """One sequence's chance that a drafted token is accepted given the one before it was: an exponentially
    weighted average over the tokens the target tested (each accepted one a success, the one that ended a draft a
    failure; the tokens after it were never tested), so a sequence that starts or stops copying is seen within a
    few tokens."""

    p: float = 0.5  # the prior: nothing seen yet
    decay: float = 0.85  # per tested token
    steps_without: int = 0  # steps in a row the policy let it draft nothing
    empty_asks: int = 0  # drafts asked for in a row that the drafter had nothing for

    def observe(self, drafted: int, accepted: int) -> None:
        keep = self.decay ** accepted
        self.p = keep * self.p + (1.0 - keep)  # `accepted` successes
        if accepted < drafted:
            self.p *= self.decay  # and the failure that ended the draft


class DraftPolicy:
    def __init__(self, *, adaptive: bool = True, probe_every: int = 16, empty_limit: int = 16, empty_every: int = 4):
        self.adaptive = adaptive
        self.probe_every = probe_every
        # asking the drafter costs a lookup every step even when it has nothing (free text): after `empty_limit`
        # empty asks in a row a sequence is asked every `empty_every` steps only (a copy that begins is still
        # seen within a few tokens); an edit's gaps between copy runs (an n-gram key's length) stay below it
        self.empty_limit = empty_limit
        self.empty_every = empty_every
        self.cost = StepCost()
        self.draft_seconds_per_token = 0.0  # the drafter's own time (a draft model's decodes), averaged
        self._seqs: dict[int, Acceptance] = {}
        # every sequence's tested tokens, with a longer memory: a new sequence starts from what drafting has been
        # earning lately, not from an even chance (short agent answers would spend their first steps learning)
        self.overall = Acceptance(decay=0.9)

    def acceptance(self, key: int) -> Acceptance:
        got = self._seqs.get(key)
        if got is None:
            got = self._seqs[key] = Acceptance(p=self.overall.p)
        return got

    def forget(self, key: int) -> None:
        self._seqs.pop(key, None)

    def length(self, key: int, n_max: int, rows: int, n_decoding: int) -> int:
        """Tokens sequence `key` should draft this step (0..n_max), the step having `rows` rows before drafts
        and `n_decoding` decoding sequences."""
        if n_max <= 0:
            return 0
        if not self.adaptive:
            return n_max
        acc = self.acceptance(key)
        if not self.cost.known:
            return min(n_max, 1)  # the first step: measure before spending rows
        per_row = self.cost.fit()[1] + self.draft_seconds_per_token
        step = self.cost.seconds(rows)
        threshold = max(n_decoding, 1) * per_row / step if step > 0 else 1.0
        p = acc.p
        k = 0
        if 0 < threshold < 1 and p > threshold:
            k = int(math.floor(math.log(threshold) / math.log(p))) if p < 1 else n_max
        k = min(k, n_max)
        if k >= 1 and (acc.empty_asks < self.empty_limit or acc.steps_without + 1 >= self.empty_every):
            acc.steps_without = 0
            return k
        acc.steps_without += 1
        # a probe stays due until a draft is tested: the drafter may have had nothing to offer at that step
        return 1 if acc.steps_without >= self.probe_every else 0

    def observe_draft(self, key: int, drafted: int, accepted: int) -> None:
        if drafted > 0:
            acc = self.acceptance(key)
            acc.observe(drafted, accepted)
            acc.steps_without = 0
            acc.empty_asks = 0
            self.overall.observe(drafted, accepted)

    def observe_empty(self, key: int) -> None:
        """The drafter had no draft for sequence `key` this step."""
        acc = self.acceptance(key)
        acc.empty_asks += 1
        if acc.empty_asks >= self.empty_limit:
            acc.steps_without = 0  # the ask was spent on nothing: the next one waits its turn

    def observe_step(self, rows: int, seconds: float) -> None:
        self.cost.observe(rows, seconds)

    def observe_drafting(self, tokens: int, seconds: float) -> None:
        if tokens > 0:
            per_token = seconds / tokens
            self.draft_seconds_per_token = 0.9 * self.draft_seconds_per_token + 0.1 * per_token
