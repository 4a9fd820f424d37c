"""Drive a real in-process engine (bootstrap.load on the embedded model) synchronously."""

from __future__ import annotations

import threading
from dataclasses import dataclass

from server.cache.kv_ops import used_cells as kv_used_cells
from server.engine.sampling_params import SamplingParams
from server.engine.sequence import Finished, GenerationRequest, TextDelta


@dataclass
class Result:
    text: str
    final: Finished


def generate(model, tokens: list[int], max_tokens: int = 8, hint=None) -> Result:
    done = threading.Event()
    parts: list[str] = []
    box: dict = {}

    def sink(ev):
        if isinstance(ev, TextDelta):
            parts.append(ev.text)
        elif isinstance(ev, Finished):
            box["final"] = ev
            done.set()

    req = GenerationRequest(prompt_tokens=tokens, sampling=SamplingParams(temperature=0), max_tokens=max_tokens,
                            cache_hint=hint)
    model.engine.submit(req, sink)
    assert done.wait(300), "request did not finish"
    return Result("".join(parts), box["final"])


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
    """Fault injection: the next state restore loads the KV, then reports failure (as if
    llama.cpp gave up halfway). Wraps this runtime instance only; production code has no hook."""
    real = runtime.state_seq_set

    def once(data, seq_id):
        runtime.state_seq_set = real
        real(data, seq_id)
        return False

    runtime.state_seq_set = once
