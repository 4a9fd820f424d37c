"""What each prefix source costs here, measured online, and the plan with the lowest
estimated time to first token.

Rates are exponentially weighted sums (amount, seconds) so one outlier does not decide:
prefill tokens/s of this model on this hardware (from finished requests: computed prompt
tokens over the time from admission to the first token, minus the cache's own work, so
it includes the batching with other requests that a new request will also see), restore
bytes/s per tier (H, D, R; measured on every restore, the file or network read included for
D and R) and the KV bytes per token. Until the prefill rate is measured the router takes the longest
match; a tier whose restore rate is not measured yet is assumed as fast as the slowest
measured one (free when none is), so it gets tried without betting on a known loss.

A restore costs a fixed part per call (the foreign calls, finding cells) and a part per
byte. Restores shorter than MIN_RESTORE_SAMPLE_TOKENS are mostly the fixed part: they
measure the per-call overhead and are kept out of the bytes/s rate (a 6-token restore once
set the host rate to 13 MB/s against 4 GB/s for whole prefixes, which made every later
restore look slower than computing).

A plan restores (or attaches) a prefix and computes the rest; its estimate is
restore overhead + restore_bytes / restore_rate + computed_tokens / prefill_rate. Attaching
(S) and keeping (A) cost no copy in the unified KV layout. In the split layout (a KV stream per
slot, server/engine/kv_layout.py) S copies another stream into the slot's, whole: a fixed cost
per copy whatever the prefix's length, `copy_ms`, measured on the device before the server
serves (LlamaRuntime.time_stream_copy: sub-millisecond on a GPU, milliseconds on a CPU), added
to every S option (`PlanOption.copy`). The lowest estimate wins; ties keep A > S > H > D > R > none.

Estimates only correct themselves for sources that get chosen: one slow sample (a restore
that ran while the machine was busy) could keep a tier out for good. So when a tier has
had no rate sample for REPROBE_AFTER plans and it holds the longest match, by more than
MIN_RESTORE_SAMPLE_TOKENS, that plan is taken once anyway (a probe, counted in the stats):
at most one request in REPROBE_AFTER pays for a stale estimate.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import cast

from server.cache.tiers import STORED, Source

# ties go A > S > H > D > R > none (the order of Source, then computing it all)
TIE_ORDER: dict[str, int] = {**{source: i for i, source in enumerate(Source)}, "none": len(Source)}


class Rate:
    """amount per second over recent observations (weight `decay` per new observation)."""

    def __init__(self, decay: float = 0.8):
        self.decay = decay
        self.amount = 0.0
        self.seconds = 0.0
        self.samples = 0

    def observe(self, amount: float, seconds: float) -> None:
        if amount <= 0 or seconds <= 0:
            return
        self.amount = self.amount * self.decay + amount
        self.seconds = self.seconds * self.decay + seconds
        self.samples += 1

    @property
    def per_second(self) -> float | None:
        return self.amount / self.seconds if self.samples else None


@dataclass(frozen=True)
class PlanOption:
    """One way to serve a prompt: reuse `length` tokens from `source`, restoring
    `restore_tokens` of them, and compute the rest."""

    source: str  # a Source's value, or "none" (compute it all)
    length: int
    restore_tokens: int = 0
    copy: bool = False  # a copy between KV streams (S in the split layout): costs copy_ms


@dataclass(frozen=True)
class Plan:
    option: PlanOption
    est_ms: float | None  # None when a needed rate is not measured yet
    estimates: dict[str, float | None]  # every source considered -> its estimate
    probe: bool = False  # taken to refresh a stale restore rate, not for its estimate

    @property
    def label(self) -> str:
        o = self.option
        return o.source if o.source != "none" else "compute"


class CostModel:
    MIN_PREFILL_SAMPLE = 16  # shorter prefills are mostly fixed per-step overhead
    MIN_RESTORE_SAMPLE_TOKENS = 64  # shorter restores are mostly the per-call overhead
    REPROBE_AFTER = 64  # plans without a rate sample of a tier before its longest match is tried anyway

    def __init__(self):
        self.prefill = Rate()  # tokens/s
        self.restore: dict[str, Rate] = {source: Rate() for source in STORED}  # bytes/s
        # restores per second of fixed cost (1 / seconds per call)
        self.overhead: dict[str, Rate] = {source: Rate() for source in STORED}
        self.bytes_per_token = 0
        self._plans_since_sample: dict[str, int] = dict.fromkeys(STORED, 0)
        self.probes = 0
        # ms one copy between split KV streams adds (None: not measured, or the unified layout, where S is free)
        self.copy_ms: float | None = None

    def observe_prefill(self, tokens: int, seconds: float) -> None:
        if tokens >= self.MIN_PREFILL_SAMPLE:
            self.prefill.observe(tokens, seconds)

    def observe_restore(self, tier: str, nbytes: int, seconds: float, tokens: int) -> None:
        if tokens > 0:
            self.bytes_per_token = nbytes // tokens
        if tokens < self.MIN_RESTORE_SAMPLE_TOKENS:
            self.overhead[tier].observe(1, seconds)
            return
        self.restore[tier].observe(nbytes, seconds)
        self._plans_since_sample[tier] = 0

    def overhead_ms(self, tier: str) -> float:
        """Measured fixed cost of one restore from `tier` (0 until a short restore was seen)."""
        calls_per_s = self.overhead[tier].per_second if tier in self.overhead else None
        return 1000.0 / calls_per_s if calls_per_s else 0.0

    def estimate_ms(self, opt: PlanOption, prompt_len: int) -> float | None:
        tps = self.prefill.per_second
        if tps is None:
            return None
        ms = 1000.0 * max(1, prompt_len - opt.length) / tps
        if opt.copy and self.copy_ms:
            ms += self.copy_ms
        if opt.restore_tokens and self.bytes_per_token:
            ms += self.overhead_ms(opt.source)
            ms += 1000.0 * opt.restore_tokens * self.bytes_per_token / self.restore_rate(opt.source)
        return ms

    def restore_rate(self, tier: str) -> float:
        """Measured bytes/s of `tier`; until measured, that of the slowest measured tier (or
        unbounded when none is): an unmeasured tier gets tried, but not at a known loss."""
        known = [r.per_second for r in self.restore.values() if r.per_second is not None]
        rate = self.restore[tier].per_second if tier in self.restore else None
        return rate if rate is not None else (min(known) if known else float("inf"))

    def choose(self, options: list[PlanOption], prompt_len: int, *, longest: bool = False) -> Plan:
        """The cheapest option; the longest (ties A > S > H > D > R) with `longest` or while the
        prefill rate is unknown."""
        options = options + [PlanOption("none", 0)]
        est = {o.source: self.estimate_ms(o, prompt_len) for o in options}
        for tier in self._plans_since_sample:
            self._plans_since_sample[tier] += 1
        if longest or any(v is None for v in est.values()):
            best = max(options, key=lambda o: (o.length, -TIE_ORDER[o.source]))
            return Plan(best, est[best.source], est)
        # every estimate is known here (the `longest` plan above takes the others)
        best = min(options, key=lambda o: (round(cast(float, est[o.source]), 3), TIE_ORDER[o.source]))
        probe = self._stale_longest(options, best)
        if probe is not None:
            self.probes += 1
            self._plans_since_sample[probe.source] = 0  # one probe per period, even if it fails
            return Plan(probe, est[probe.source], est, probe=True)
        return Plan(best, est[best.source], est)

    def _stale_longest(self, options: list[PlanOption], best: PlanOption) -> PlanOption | None:
        """The longest option if it restores from a tier whose measured rate is stale and it
        reuses clearly more than `best`; else None."""
        longest = max(options, key=lambda o: (o.length, -TIE_ORDER[o.source]))
        if longest is best or longest.source not in self.restore or not self.restore[longest.source].samples:
            return None
        if self._plans_since_sample[longest.source] < self.REPROBE_AFTER:
            return None
        if longest.length - best.length <= self.MIN_RESTORE_SAMPLE_TOKENS:
            return None
        return longest

    def stats(self) -> dict:
        """Read from other threads (/metrics) while the engine updates the rates: the dicts
        are copied first (a copy is atomic; iterating one that gains a key is not)."""
        restore, overhead = tuple(self.restore.items()), tuple(self.overhead)
        return {"prefill_tokens_per_s": self.prefill.per_second,
                "restore_bytes_per_s": {k: r.per_second for k, r in restore},
                "restore_overhead_ms": {k: self.overhead_ms(k) for k in overhead},
                "kv_bytes_per_token": self.bytes_per_token,
                "stream_copy_ms": self.copy_ms,
                "probes": self.probes,
                "samples": {"prefill": self.prefill.samples, **{k: r.samples for k, r in restore}}}
