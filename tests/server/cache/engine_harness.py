"""Drive a real in-process engine (bootstrap.load on the embedded model) synchronously."""

from __future__ import annotations

import threading
from dataclasses import dataclass, field

from server.cache.kv_ops import used_cells as kv_used_cells
from server.engine.logprobs import TokenLogprob
from server.engine.sampling_params import SamplingParams
from server.engine.sequence import Finished, GenerationRequest, TextDelta
from tests.server.near_tie import NEAR_TIE_NATS, Step, first_parting, gap

TOP_K = 5  # log-probabilities kept per generated token: enough to find the other run's choice


@dataclass
class Result:
    text: str
    final: Finished
    tokens: list[int] = field(default_factory=list)
    logprobs: list[TokenLogprob] = field(default_factory=list)


def generate(model, tokens: list[int], max_tokens: int = 8, hint=None, top_k: int = TOP_K,
             ignore_eos: bool = False) -> Result:
    """Greedy generation, with each generated token's log-probability and the `top_k` most likely."""
    done = threading.Event()
    parts: list[str] = []
    logprobs: list[TokenLogprob] = []
    box: dict = {}

    def sink(ev):
        if isinstance(ev, TextDelta):
            parts.append(ev.text)
            logprobs.extend(ev.logprobs)
        elif isinstance(ev, Finished):
            box["final"] = ev
            done.set()

    req = GenerationRequest(prompt_tokens=tokens, sampling=SamplingParams(temperature=0), max_tokens=max_tokens,
                            cache_hint=hint, logprobs=top_k, ignore_eos=ignore_eos)
    model.engine.submit(req, sink)
    assert done.wait(300), "request did not finish"
    return Result("".join(parts), box["final"], [lp.token for lp in logprobs], logprobs)


def divergence(got: Result, want: Result, is_eog) -> str | None:
    """None when `got` is `want`'s greedy answer, or leaves it only at a near-tie
    (tests/server/near_tie.py); else what differs, for the assertion message. `is_eog(token)`:
    the model's end-of-generation test (an answer that stops where the other goes on chose an
    end-of-generation token, which the other run's row ranks)."""
    i, worst = parting_gap(got, want, is_eog)
    if i is None or worst <= NEAR_TIE_NATS:
        return None
    return (f"greedy answers differ at token {i} by {worst:.3f} nats "
            f"(a near-tie is <= {NEAR_TIE_NATS}): {got.text!r} vs {want.text!r}")


def parting_gap(got: Result, want: Result, is_eog) -> tuple[int | None, float]:
    """Where two greedy answers part (None: they do not) and how far apart the two choices were
    there: the larger of the two runs' own gaps (inf when a run did not rank the other's choice;
    nan when neither run has a row there)."""
    i = first_parting(got.tokens, want.tokens)
    if i is None:
        return None, 0.0
    gaps = []
    for run, other in ((want, got), (got, want)):
        if i >= len(run.logprobs):
            continue  # this run stopped at i (EOG or its length): the other run's row decides
        row = run.logprobs[i]
        step = Step(row.token, row.logprob, dict(row.top))
        if i < len(other.tokens):
            gaps.append(gap(step, other.tokens[i]))
        elif other.final.finish_reason == "stop":
            gaps.append(min((gap(step, t) for t in step.top if is_eog(t)), default=float("inf")))
    return i, max(gaps, default=float("nan"))


def logprob_drift(got: Result, want: Result) -> float:
    """Teacher-forced comparison of two runs' log-probabilities: the largest |difference| over the
    tokens both rank, at every position where both runs read the same tokens before it (up to and
    including the first parting). Where the two computed the same KV, only floating-point
    rounding separates them."""
    i = first_parting(got.tokens, want.tokens)
    upto = min(len(got.logprobs), len(want.logprobs), len(got.tokens) if i is None else i + 1)
    worst = 0.0
    for k in range(upto):
        a, b = dict(got.logprobs[k].top), dict(want.logprobs[k].top)
        worst = max([worst, *(abs(a[t] - b[t]) for t in a.keys() & b.keys())])
    return worst


@dataclass(frozen=True)
class Comparison:
    """One cache-on answer against the cache-off answer to the same prompt."""

    source: str  # the tier the cache-on run reused its prefix from ("none": computed)
    parting: int | None  # the first token where the answers differ; None: identical
    gap: float  # nats between the two choices there (parting_gap)
    drift: float  # logprob_drift
    problem: str | None  # divergence()'s verdict

    @property
    def first_token_parts(self) -> bool:
        return self.parting == 0


def compare(got: Result, want: Result, is_eog) -> Comparison:
    i, worst = parting_gap(got, want, is_eog)
    return Comparison(got.final.cache.source if got.final.cache else "none", i, worst,
                      logprob_drift(got, want), divergence(got, want, is_eog))


def comparison_summary(rows: list[Comparison]) -> str:
    """One line per run: how many answers part, where and at what gap, and the largest drift."""
    parted = [r for r in rows if r.parting is not None]
    return (f"{len(rows) - len(parted)}/{len(rows)} identical; {len(parted)} part "
            f"(token, gap in nats: {[(r.parting, round(r.gap, 3)) for r in parted]}); "
            f"largest teacher-forced drift {max((r.drift for r in rows), default=0.0):.3g}")


def assert_same_answer(model, got: Result, want: Result) -> None:
    """`got` (cache on) is `want`'s (cache off) greedy answer, up to a near-tie (see divergence)."""
    problem = divergence(got, want, model.runtime.is_eog)
    assert problem is None, problem


def generate_many(model, prompts: list[list[int]], max_tokens: int = 8) -> list[Result]:
    """Submit all at once (they run concurrently), wait for all."""
    results: list[Result | None] = [None] * len(prompts)
    threads = []
    for i, p in enumerate(prompts):
        t = threading.Thread(target=lambda i=i, p=p: results.__setitem__(i, generate(model, p, max_tokens)))
        threads.append(t)
        t.start()
    for t in threads:
        t.join(600)
    return results  # type: ignore[return-value]


def chat_tokens(model, system: str, user: str) -> list[int]:
    text = f"<|im_start|>system\n{system}<|im_end|>\n<|im_start|>user\n{user}<|im_end|>\n<|im_start|>assistant\n"
    return model.runtime.tokenize(text, add_special=False, parse_special=True)


def used_cells(model) -> int:
    return model.engine.run_exclusive(lambda: kv_used_cells(model.runtime))


def kept_cells(model) -> int:
    """Cells the engine's own bookkeeping says are held: idle slots' tokens, resident owners
    and slots' copies still parked for write-back."""
    from server.cache.resident import union_positions

    held = [list(s.tokens) for s in model.slots.slots]
    if model.router is not None and model.router.resident is not None:
        held += [o.tokens for o in model.router.resident.owners]
    if model.router is not None and model.router.parked is not None:
        held += [c.tokens for c in model.router.parked.queue]
    return union_positions([h for h in held if h])


def reset_kv(model) -> None:
    """Empty every slot and resident owner, as a KV shortage would: through the router, so
    what tiers H/D lack is written back first (they keep their segments)."""

    def job():
        if model.router is not None:
            model.router.drop_device_copies()
            return
        for s in model.slots.slots:
            model.runtime.seq_rm(s.seq_id, -1, -1)
            s.tokens = []

    model.engine.run_exclusive(job)


def fail_next_restore(runtime) -> None:
    """Fault injection: the next state restore, whole or staged, loads the KV (takes the cells), then reports failure
    (as if llama.cpp gave up halfway). Wraps this runtime instance only; production code has no hook."""
    real, real_stage = runtime.state_seq_set, runtime.stage_state

    def once(data, seq_id):
        runtime.state_seq_set, runtime.stage_state = real, real_stage
        real(data, seq_id)
        return False

    def stage_once(data, seq_id):
        runtime.state_seq_set, runtime.stage_state = real, real_stage
        staged = real_stage(data, seq_id)
        if staged is not None:
            staged.free()
        return None

    runtime.state_seq_set, runtime.stage_state = once, stage_once
