"""A request as the engine sees it: its tokens, its progress and its output channel.

A `Sequence` carries everything about one generation through schedule() -> forward() ->
postprocess(): the prompt, how many prompt tokens already have KV (`n_past`), the output
tokens, and the text state (incremental detokenizer + stop strings). It does not know
llama.cpp: the runner supplies token pieces and end-of-generation checks.
"""

from __future__ import annotations

import enum
import itertools
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Protocol

from server.engine.cache_namespace import keyed
from server.engine.detokenizer import IncrementalDetokenizer
from server.engine.logprobs import TokenLogprob
from server.engine.sampling_params import SamplingParams
from server.engine.stop_strings import StopStringMatcher

_ids = itertools.count(1)

# What a runner returns instead of a token when the request's sampler can accept none (its
# grammar is at a dead end); llama.cpp's LLAMA_TOKEN_NULL. The engine stops the request.
NO_TOKEN = -1


class TokenPiece(Protocol):
    """The bytes of one token; `special`: render a special token's text too (the runner's piece)."""

    def __call__(self, token: int, *, special: bool = False) -> bytes: ...


class SeqStatus(enum.Enum):
    WAITING = "waiting"        # in the queue, no slot yet
    LOADING = "loading"        # has a slot; its cached prefix is being read (from disk) ahead of compute
    PREFILLING = "prefilling"  # has a slot; prompt tokens still to compute
    DECODING = "decoding"      # generating tokens
    FINISHED = "finished"


@dataclass(frozen=True)
class GenerationRequest:
    """What the API submits: tokens in, limits and sampling settings."""

    prompt_tokens: list[int]
    sampling: SamplingParams
    max_tokens: int
    stop: list[str] = field(default_factory=list)
    ignore_eos: bool = False
    cache_hint: Any = None  # server.cache.lifecycle.CacheHint, when the client sent one
    # Output tokens whose KV cells admission guarantees (None: all of max_tokens). A request
    # may grow past it while cells are free; when the pool is full it is the one stopped.
    reserved_output: int | None = None
    # Log-probabilities to report: None for none, k >= 0 for the sampled token's and the k
    # most likely alternatives' (runner fills Sequence.next_logprobs for these requests).
    logprobs: int | None = None
    # Requests of one group (the n choices of one API request) share one prompt prefill:
    # a member waits while another computes the common prompt, then attaches its KV.
    prefill_group: object | None = None
    # Special tokens a chat format writes as text (a family's <|channel|> or [TOOL_CALLS]):
    # their pieces are rendered, so the family's parser sees them (llama-server's preserved_tokens).
    preserved_tokens: frozenset[int] = frozenset()
    # Cache isolation (`cache_salt`, --cache-salt-per-key; server/engine/cache_namespace.py): an
    # opaque namespace set by the API layer. Requests in different namespaces (or one without)
    # never share KV: the cache sees this request's tokens under their namespaced cache key.
    cache_namespace: bytes | None = None
    # Speculative decoding (llama-server's speculative.n_max / n_min): at most this many drafted tokens per
    # step (None: the drafter's own limit; 0: this request never drafts), and drafts shorter than n_min unused.
    speculative_n_max: int | None = None
    speculative_n_min: int | None = None

    @property
    def reserved_cells(self) -> int:
        """KV cells this request is guaranteed: its prompt plus its reserved output."""
        out = self.max_tokens if self.reserved_output is None else min(self.reserved_output, self.max_tokens)
        return len(self.prompt_tokens) + out


@dataclass(frozen=True)
class TextDelta:
    """Newly generated text (already cleared of any stop string) and the token(s) behind it.

    `logprobs` (only for requests that asked) covers the tokens generated since the last
    delta: text held back (a possible stop string, a partial UTF-8 character) carries its
    tokens' entries with it."""

    text: str
    tokens: tuple[int, ...]
    logprobs: tuple[TokenLogprob, ...] = ()


@dataclass(frozen=True)
class CacheReport:
    """Where the reused prefix of a request came from (docs/architecture.md's sources A/S/H/D/R)."""

    source: str = "none"  # "A" | "S" | "H" | "D" | "R" | "none"
    reused_tokens: int = 0
    restored_bytes: int = 0
    restore_ms: float = 0.0
    plan: str = "compute"  # what the cache router chose (a source, or "compute")
    est_ms: float | None = None  # its estimated time to first token, when rates are known
    # The prefix past reused_tokens is being read on an I/O thread: the sequence waits
    # (LOADING) until the provider's advance_loads() hands over its final report.
    loading: bool = False


@dataclass(frozen=True)
class Finished:
    """The last event of every request."""

    finish_reason: str  # "stop" | "length" | "cancelled" | "error"
    prompt_tokens: int
    cached_tokens: int
    completion_tokens: int
    prompt_ms: float
    predicted_ms: float
    cache: CacheReport
    error: str | None = None
    stop_word: str | None = None
    retryable: bool = False  # the error is a momentary lack of resources (HTTP 503), not a fault
    # speculative decoding: tokens drafted for this request and how many of them the target accepted
    draft_n: int = 0
    draft_n_accepted: int = 0


Event = TextDelta | Finished
EventSink = Callable[[Event], None]


class Sequence:
    def __init__(self, request: GenerationRequest, sink: EventSink):
        self.id = next(_ids)
        self.request = request
        self.prompt = list(request.prompt_tokens)
        # the prompt as the cache names it (server/engine/cache_namespace.py): `prompt` itself
        # without a namespace; with one, its first token is the namespace's marker
        self.cache_prompt = keyed(self.prompt, request.cache_namespace)
        self.sink = sink
        self.status = SeqStatus.WAITING
        self.slot: Any = None  # the Slot it runs on, once admitted
        self.n_past = 0  # tokens whose KV the slot's sequence holds
        self.n_cached = 0  # prompt tokens reused rather than computed
        self.cache_report = CacheReport()
        # The request's hold on the prefix cache (server.cache.lease.CacheLease) from the cache's
        # first sight of it to its end: plan, kept tokens, locked tip, pending read, overhead, hint.
        self.cache_lease: Any = None
        # Prompt positions at which a prefill chunk must end, ascending (set by the prefix
        # provider at admission): after the chunk ending at one, the runner asks the provider
        # to checkpoint the state there (server/cache/checkpoints.py; models with sliding-window
        # or recurrent layers only, whose state cannot be cut back to an earlier position).
        self.prefill_stops: tuple[int, ...] = ()
        self.output: list[int] = []
        self.sampler: Any = None  # runner-owned sampler state
        # set by the runner with the sampled tokens, one per token in order (several when a draft was accepted)
        self.next_logprobs: list[TokenLogprob] = []
        self.n_drafted = 0  # tokens drafted for it (speculative decoding)
        self.n_draft_accepted = 0  # of which the target accepted
        self._logprobs_held: list[TokenLogprob] = []
        self._cancel = threading.Event()
        self._detok: IncrementalDetokenizer | None = None
        self._stops = StopStringMatcher(request.stop)
        self.finish_reason: str | None = None
        self.t_submit = time.perf_counter()
        self.t_prefill_start: float | None = None
        self.t_first_token: float | None = None
        self.t_last_token: float | None = None

    # --------------------------------------------------------------- progress
    @property
    def reserved_cells(self) -> int:
        return self.request.reserved_cells

    @property
    def past_reservation(self) -> bool:
        """True when the sequence holds (or is about to hold) more cells than it reserved."""
        return self.n_past + 1 > self.reserved_cells

    @property
    def prompt_remaining(self) -> int:
        return len(self.prompt) - self.n_past if self.status is SeqStatus.PREFILLING else 0

    def kv_tokens(self) -> list[int]:
        """The tokens whose KV the slot holds right now (prompt, then fed outputs), as the cache
        names them (their cache key: the first is the namespace's marker when the request has
        one). Only the cache and the slots read it; the runner computes `prompt` and `output`."""
        all_tokens = self.prompt + self.output
        return keyed(all_tokens[: self.n_past], self.request.cache_namespace)

    def cancel(self) -> None:
        """Thread-safe: ask the engine to stop this request at its next step."""
        self._cancel.set()

    @property
    def cancelled(self) -> bool:
        return self._cancel.is_set()

    # ----------------------------------------------------------------- output
    def on_token(self, token: int, piece: TokenPiece, is_eog: Callable[[int], bool]) -> bool:
        """Record a sampled token, emit its text, and return True when generation must stop."""
        now = time.perf_counter()
        if self.t_first_token is None:
            self.t_first_token = now
        self.t_last_token = now
        if self._detok is None:
            preserved = self.request.preserved_tokens
            self._detok = IncrementalDetokenizer(
                (lambda t: piece(t, special=True) if t in preserved else piece(t)) if preserved else piece)
        logprob = self.next_logprobs.pop(0) if self.next_logprobs else None
        if is_eog(token) and not self.request.ignore_eos:
            self.finish_reason = "stop"
            return True
        self.output.append(token)
        if logprob is not None:
            self._logprobs_held.append(logprob)
        text = self._stops.feed(self._detok.feed(token))
        if text:
            self.sink(TextDelta(text=text, tokens=(token,), logprobs=self._take_logprobs()))
        if self._stops.stopped:
            self.finish_reason = "stop"
            return True
        if len(self.output) >= self.request.max_tokens:
            self.finish_reason = "length"
            return True
        return False

    def _take_logprobs(self) -> tuple[TokenLogprob, ...]:
        if not self._logprobs_held:
            return ()
        held = tuple(self._logprobs_held)
        self._logprobs_held.clear()
        return held

    def finish(self, reason: str | None = None, error: str | None = None, retryable: bool = False) -> Finished:
        """Flush held text, mark finished and deliver the final event (exactly once)."""
        if self.status is SeqStatus.FINISHED:
            raise RuntimeError(f"sequence {self.id} finished twice")
        self.status = SeqStatus.FINISHED
        reason = reason or self.finish_reason or "stop"
        self.finish_reason = reason
        if reason in ("stop", "length") and self._detok is not None:
            tail = self._stops.feed(self._detok.flush()) + self._stops.flush()
            if self._stops.stopped:
                self._logprobs_held.clear()  # held tokens spelled the stop string, which is not output
            if tail or self._logprobs_held:
                self.sink(TextDelta(text=tail, tokens=(), logprobs=self._take_logprobs()))
        t0 = self.t_submit  # TTFT and prompt_ms include queueing: what the client waited
        t1 = self.t_first_token or time.perf_counter()
        event = Finished(
            finish_reason=reason,
            prompt_tokens=len(self.prompt),
            cached_tokens=self.n_cached,
            completion_tokens=len(self.output),
            prompt_ms=(t1 - t0) * 1000.0,
            predicted_ms=((self.t_last_token or t1) - t1) * 1000.0,
            cache=self.cache_report,
            error=error,
            stop_word=self._stops.matched,
            retryable=retryable,
            draft_n=self.n_drafted,
            draft_n_accepted=self.n_draft_accepted,
        )
        self.sink(event)
        return event
