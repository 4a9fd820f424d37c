"""The engine loop: one thread that admits, plans, runs and post-processes steps.

HTTP handlers call `submit()` and `Sequence.cancel()` from the event loop; everything that
touches the model runs on the engine thread. The thread holds the scheduler lock only
while it changes scheduler state, never during a decode, so submissions and /slots stay
responsive while the model computes.

Events (text deltas, the final `Finished`) are not handed to their sinks one by one: a
step collects them and passes the whole list to `deliver` once, at the end of the step.
The HTTP layer's `deliver` makes that one thread hand-off (one event-loop wake-up) per
step for every stream together, instead of one per token per stream; the default calls
each sink on the engine thread (tests, in-process benchmarks).
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Protocol

from server.engine.kv_full import KVCacheFull
from server.engine.scheduler import Admission, QueueFull, Scheduler, StepItem
from server.engine.sequence import NO_TOKEN, Event, EventSink, GenerationRequest, SeqStatus, Sequence
from server.engine.slots import SlotPool

log = logging.getLogger(__name__)

__all__ = ["Engine", "ModelRunner", "QueueFull", "EngineStats", "Deliver", "deliver_inline"]

# How often the engine looks for finished reads ahead when it has nothing else to do.
LOAD_POLL_S = 0.002

# Receives one step's events, in order, as (sink, event) pairs.
Deliver = Callable[[list[tuple[EventSink, Event]]], None]


def deliver_inline(events: list[tuple[EventSink, Event]]) -> None:
    for sink, event in events:
        sink(event)


class ModelRunner(Protocol):
    """What the engine needs from a model backend (llama.cpp, or a simulation in tests)."""

    def prepare(self, admission: Admission) -> None:
        """Set up the slot's KV for the sequence (reuse what it can), set seq.n_past,
        seq.n_cached, seq.cache_report and seq.sampler. Raise to fail the request."""

    def forward(self, items: list[StepItem]) -> list[list[int] | None]:
        """Decode the batch; for items with sample=True return the tokens sampled, in order (one, or with a
        verified draft the accepted drafted tokens and the one sampled after them; the item's `kept` then says
        how many of its tokens keep their KV), else None. A list ending with NO_TOKEN: the sampler could accept
        no token there (the engine stops the request). Raise KVCacheFull, having computed nothing (and kept no
        draft), when the KV pool has no room for the batch."""

    def release(self, seq: Sequence, reason: str) -> None:
        """The sequence finished for `reason`: free per-request state, keep reusable KV.
        After an error the slot's KV is not trusted: the runner clears it and sets n_past=0."""

    def reclaim(self, slots: SlotPool) -> bool:
        """Free KV cells that no running request uses; False when nothing is left."""

    def background(self, idle: bool) -> None:
        """Bounded cache work once per step after the decode (all of it when `idle`)."""

    def idle_work(self) -> float | None:
        """The engine has nothing to compute: cache work ahead of requests (a prefetch). Returns the
        seconds until it wants to be called again while nothing comes, None: not until new work."""

    def advance_loads(self) -> None:
        """Sequences whose cached prefix was read ahead (LOADING) become ready to prefill."""

    def loads_ready(self) -> bool:
        """A read ahead finished and waits for advance_loads (asked from the engine loop)."""

    def piece(self, token: int, *, special: bool = False) -> bytes: ...

    def is_eog(self, token: int) -> bool: ...


@dataclass(frozen=True)
class EngineStats:
    n_waiting: int
    n_running: int
    n_decode_calls: int
    n_tokens_decoded: int
    busy_seconds: float
    n_kv_full: int  # decodes that found the KV pool full and had to free cells first
    n_preempted: int  # requests stopped because the pool stayed full


class Engine:
    def __init__(self, runner: ModelRunner, scheduler: Scheduler, deliver: Deliver = deliver_inline):
        self.runner = runner
        self.deliver = deliver
        self._outbox: list[tuple[EventSink, Event]] = []  # this step's events (engine thread only)
        self.scheduler = scheduler
        self._lock = threading.Lock()
        self._wake = threading.Condition(self._lock)
        self._stop = False
        self._thread: threading.Thread | None = None
        self._n_decode_calls = 0
        self._n_tokens_decoded = 0
        self._busy_seconds = 0.0
        self._n_kv_full = 0
        self._n_preempted = 0
        self._jobs: list = []  # callables to run on the engine thread between steps

    # --------------------------------------------------------------- control
    def start(self) -> None:
        self._thread = threading.Thread(target=self._loop, name="arbor-engine", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        with self._wake:
            self._stop = True
            self._wake.notify_all()
        if self._thread is not None:
            self._thread.join(timeout=30)

    def submit(self, request: GenerationRequest, sink: EventSink) -> Sequence:
        """Queue a request; raises QueueFull at once when the waiting queue is full."""
        def collect(event: Event) -> None:  # called on the engine thread only
            self._outbox.append((sink, event))

        seq = Sequence(request, collect)
        with self._wake:
            self.scheduler.add(seq)
            self._wake.notify_all()
        return seq

    def cancel(self, seq: Sequence) -> None:
        seq.cancel()
        with self._wake:
            self._wake.notify_all()

    def run_exclusive(self, fn):
        """Run fn() on the engine thread between steps (for cache maintenance such as
        /cache/flush) and return its result. Blocks the caller until done."""
        done = threading.Event()
        box: dict = {}

        def job():
            try:
                box["value"] = fn()
            except BaseException as exc:  # noqa: BLE001 - handed back to the caller
                box["error"] = exc
            finally:
                done.set()

        with self._wake:
            self._jobs.append(job)
            self._wake.notify_all()
        done.wait()
        if "error" in box:
            raise box["error"]
        return box.get("value")

    def stats(self) -> EngineStats:
        with self._lock:
            return EngineStats(
                n_waiting=self.scheduler.n_waiting,
                n_running=self.scheduler.n_running,
                n_decode_calls=self._n_decode_calls,
                n_tokens_decoded=self._n_tokens_decoded,
                busy_seconds=self._busy_seconds,
                n_kv_full=self._n_kv_full,
                n_preempted=self._n_preempted,
            )

    # ------------------------------------------------------------------ loop
    def _loop(self) -> None:
        ahead: float | None = 0.0  # seconds until the runner's work ahead of requests is due (None: not)
        while True:
            with self._wake:
                if not self._stop and not self._has_work():
                    idle_wait = 1.0 if ahead is None else min(1.0, ahead)
                    self._wake.wait(timeout=LOAD_POLL_S if self.scheduler.running else idle_wait)
                if self._stop:
                    break
                nothing = not self._has_work()
                alone = not self.scheduler.running
            if nothing:  # a wake-up with nothing to compute: at most the runner's work ahead
                if alone:
                    ahead = self._work_ahead()
                continue
            ahead = 0.0  # after requests: ask the runner again once idle
            try:
                worked = self.step()
            except Exception:  # keep serving: a bug in one step must not kill the server
                log.exception("engine step failed")
                worked = True
            if not worked and self._loading():
                with self._wake:  # only reads ahead to wait for: do not spin
                    self._wake.wait(timeout=LOAD_POLL_S)
        self._fail_all("server shutting down")
        self._flush()

    def _work_ahead(self) -> float | None:
        """The runner's idle work (a prefetch); seconds until it wants to run again, None: not before new work."""
        try:
            return self.runner.idle_work()
        except Exception:  # keep serving: work ahead of requests must never stop them
            log.exception("engine idle work failed")
            return None

    def _loading(self) -> bool:
        return any(s.status is SeqStatus.LOADING for s in self.scheduler.running)

    def _has_work(self) -> bool:
        if self._jobs or self.scheduler.waiting:
            return True
        return (any(s.status is not SeqStatus.LOADING for s in self.scheduler.running)
                or (bool(self.scheduler.running) and self.runner.loads_ready()))

    def step(self) -> bool:
        """Run one engine step and deliver its events, then the runner's bounded background
        work (all of it when no request is left); returns False when there was nothing to compute."""
        try:
            worked = self._step()
        finally:
            self._flush()
        # after the hand-off: the streams' text goes out while the cache works
        with self._lock:
            idle = not (self.scheduler.running or self.scheduler.waiting)
        self.runner.background(idle=idle)
        return worked

    def _flush(self) -> None:
        if self._outbox:
            events, self._outbox = self._outbox, []
            try:
                self.deliver(events)
            except Exception:
                log.exception("delivering %d events failed", len(events))

    def _step(self) -> bool:
        with self._lock:
            jobs, self._jobs = self._jobs, []
        for job in jobs:
            job()
        with self._lock:
            cancelled = self.scheduler.take_cancelled()
        for seq in cancelled:
            self._finish(seq, "cancelled")
        while True:
            adm = self.scheduler.admit_one(self._lock)  # decides without the lock (see admit_one)
            if adm is None:
                break
            adm.seq.t_prefill_start = time.perf_counter()
            try:
                self.runner.prepare(adm)
            except Exception as exc:  # noqa: BLE001 - the request fails, the engine goes on
                log.warning("request %d failed while preparing: %s", adm.seq.id, exc)
                self._finish(adm.seq, "error", error=str(exc))
        self.runner.advance_loads()
        with self._lock:
            items = self.scheduler.plan()
        if not items:
            return False
        t0 = time.perf_counter()
        try:
            items, sampled = self._forward_making_room(items)
        except Exception as exc:  # noqa: BLE001 - the step's requests fail, the engine goes on
            log.error("decode failed: %s", exc)
            for seq in {id(i.seq): i.seq for i in items}.values():
                self._finish(seq, "error", error=f"decode failed: {exc}")
            return True
        self._busy_seconds += time.perf_counter() - t0
        self._n_decode_calls += 1
        self._n_tokens_decoded += sum(len(i.tokens) for i in items)
        with self._lock:
            self.scheduler.commit(items)
        piece, is_eog = self.runner.piece, self.runner.is_eog
        for item, tokens in zip(items, sampled):
            if tokens is None or item.seq.status is SeqStatus.FINISHED:
                continue
            seq = item.seq
            for token in tokens:
                if token == NO_TOKEN:
                    # Nothing can follow what was generated (a grammar's dead end): the request
                    # ends here as if the model had stopped, and the server keeps running.
                    self._finish(seq, "stop")
                    break
                if seq.on_token(token, piece, is_eog):
                    # a verified draft may have run past where the request stops: its KV holds at most
                    # the prompt and the output (what the cache may keep)
                    seq.n_past = min(seq.n_past, len(seq.prompt) + len(seq.output))
                    self._finish(seq, None)
                    break
        return True

    def _forward_making_room(self, items: list[StepItem]) -> tuple[list[StepItem], list[list[int] | None]]:
        """Decode `items`; while the KV pool is full, free cells and decode again.

        Idle slots' kept KV and cached prefixes give way first. If the pool is still full,
        the request that grew past its reservation stops with "length" (it reached what the
        pool can give, as llama-server stops at a full context); a request within its
        reservation is only stopped (with an error) if no such one exists. Returns the
        items that ran and their samples.
        """
        while items:
            try:
                return items, self.runner.forward(items)
            except KVCacheFull:
                self._n_kv_full += 1
            if self.runner.reclaim(self.scheduler.slots):
                continue
            with self._lock:
                victim = self.scheduler.preemption_victim()
            if victim is None:
                break
            self._n_preempted += 1
            log.warning("KV pool full: stopping request %d at %d cells", victim.id, victim.n_past)
            if victim.past_reservation:
                self._finish(victim, "length")
            else:
                self._finish(victim, "error", error="the KV cache is full; retry later", retryable=True)
            items = [i for i in items if i.seq is not victim]
        return [], []

    def _finish(self, seq: Sequence, reason: str | None, error: str | None = None, retryable: bool = False) -> None:
        try:
            self.runner.release(seq, reason or seq.finish_reason or "stop")
        except Exception:
            log.exception("releasing request %d failed", seq.id)
        with self._lock:
            self.scheduler.remove(seq)
        seq.finish(reason, error=error, retryable=retryable)

    def _fail_all(self, why: str) -> None:
        with self._lock:
            seqs = list(self.scheduler.waiting) + list(self.scheduler.running)
            self.scheduler.waiting.clear()
        for seq in seqs:
            if seq.status is not SeqStatus.FINISHED:
                self._finish(seq, "error", error=why)

