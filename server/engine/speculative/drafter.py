"""llama.cpp's drafters for the engine's sequences, through libarbor-spec (server.engine.speculative.library).

A `Drafter` drafts for `n_lanes` sequences at once (the engine's slots, lane = slot index). Each lane keeps its
sequence's history in the library: `begin` a lane with the tokens whose KV the target holds, `push` what the
target decoded since, `draft` for several lanes in one call, and `accept` how many tokens of a lane's draft the
target kept. draft-simple's draft model runs in a context of its own, created here with one sequence per lane;
its KV follows each lane's history (the longest common prefix kept: a slot's next request reuses what its last
one left there). Engine thread only: llama.cpp contexts are not thread-safe.
"""

from __future__ import annotations

import ctypes
import logging
from dataclasses import dataclass

import llama_cpp

from server.engine.speculative.config import HIDDEN_STATE_REASON, HIDDEN_STATE_TYPES, SpecConfig
from server.engine.speculative.library import SpecParams, default_params, spec_library, take_error

log = logging.getLogger(__name__)


class DrafterError(ValueError):
    """The drafter cannot be made as configured (the message names the flag); the server refuses to start."""


@dataclass(frozen=True)
class DraftRequest:
    lane: int
    id_last: int  # the token the target sampled last and has not decoded yet
    pos0: int  # its position
    n_max: int  # at most this many tokens (>= 1)


class _DraftModel:
    """The draft model of draft-simple and its context (one sequence per lane)."""

    def __init__(self, config: SpecConfig, n_lanes: int, n_ctx: int, n_batch: int, n_threads: int):
        assert config.draft_model is not None
        mparams = llama_cpp.llama_model_default_params()
        mparams.n_gpu_layers = config.draft_gpu_layers
        self.model = llama_cpp.llama_model_load_from_file(str(config.draft_model).encode(), mparams)
        if not self.model:
            raise DrafterError(f"--spec-draft-model {config.draft_model}: llama.cpp could not load it")
        cparams = llama_cpp.llama_context_default_params()
        cparams.n_ctx = n_ctx
        cparams.n_batch = cparams.n_ubatch = n_batch
        cparams.n_seq_max = n_lanes
        cparams.kv_unified = True
        cparams.no_perf = True
        threads = config.draft_threads or n_threads
        cparams.n_threads = cparams.n_threads_batch = threads
        self.ctx = llama_cpp.llama_init_from_model(self.model, cparams)
        if not self.ctx:
            llama_cpp.llama_model_free(self.model)
            raise DrafterError(f"--spec-draft-model {config.draft_model}: could not create its context "
                               f"({n_ctx} cells, {n_lanes} sequences)")

    def close(self) -> None:
        if self.ctx:
            llama_cpp.llama_free(self.ctx)
            self.ctx = None
        if self.model:
            llama_cpp.llama_model_free(self.model)
            self.model = None


def _params(config: SpecConfig, n_lanes: int) -> SpecParams:
    p = default_params()
    p.types = ",".join(config.resolved_types).encode()
    p.n_lanes = n_lanes
    if config.draft_n_max is not None:
        p.draft_n_max = config.draft_n_max
    if config.draft_n_min is not None:
        p.draft_n_min = config.draft_n_min
    if config.draft_p_min is not None:
        p.draft_p_min = config.draft_p_min
    for prefix, values, parts in (
            ("ngram_simple", config.ngram_simple, ("size_n", "size_m", "min_hits")),
            ("ngram_map_k", config.ngram_map_k, ("size_n", "size_m", "min_hits")),
            ("ngram_map_k4v", config.ngram_map_k4v, ("size_n", "size_m", "min_hits")),
            ("ngram_mod", config.ngram_mod, ("n_match", "n_min", "n_max"))):
        for value, part in zip(values, parts):
            if value is not None:
                setattr(p, f"{prefix}_{part}", value)
    if config.ngram_cache_static is not None:
        p.ngram_cache_static = str(config.ngram_cache_static).encode()
    if config.ngram_cache_dynamic is not None:
        p.ngram_cache_dynamic = str(config.ngram_cache_dynamic).encode()
    return p


class Drafter:
    def __init__(self, config: SpecConfig, n_lanes: int, *, ctx_tgt=None, n_ctx: int = 0, n_batch: int = 512,
                 n_threads: int = 1):
        if not config.resolved_types:
            raise ValueError("no drafter types (--spec-type none)")
        self.config = config
        self.types = config.resolved_types
        self.n_lanes = n_lanes
        self._lib = spec_library()
        self._draft_model: _DraftModel | None = None
        refused = [t for t in self.types if t in HIDDEN_STATE_TYPES]
        if refused:
            raise DrafterError(f"--spec-type {', '.join(refused)}: {HIDDEN_STATE_REASON}")
        if config.needs_model:
            if config.draft_model is None:
                raise DrafterError(f"--spec-type {','.join(self.types)} needs a draft model: --spec-draft-model FILE")
            self._draft_model = _DraftModel(config, n_lanes, n_ctx, n_batch, n_threads)
        elif config.draft_model is not None:
            raise DrafterError(f"--spec-draft-model is given but --spec-type {','.join(self.types)} uses no draft "
                               "model: add draft-simple or drop --spec-draft-model")
        params = _params(config, n_lanes)
        params.ctx_tgt = ctx_tgt
        params.ctx_dft = self._draft_model.ctx if self._draft_model else None
        self._keep = params  # the strings it points to live as long as the drafter
        err = ctypes.c_void_p()
        handle = self._lib.arbor_spec_init(ctypes.byref(params), ctypes.byref(err))
        if not handle:
            message = take_error(err, "llama.cpp made no drafter")
            if self._draft_model:
                self._draft_model.close()
            raise DrafterError(f"--spec-type {','.join(self.types)}: {message}")
        self._h: int | None = handle
        self.n_max = int(self._lib.arbor_spec_n_max(handle))
        self._lanes = (ctypes.c_int32 * n_lanes)()
        self._id_last = (llama_cpp.llama_token * n_lanes)()
        self._pos0 = (ctypes.c_int32 * n_lanes)()
        self._n_max = (ctypes.c_int32 * n_lanes)()
        self._out = (llama_cpp.llama_token * (n_lanes * max(1, self.n_max)))()
        self._out_n = (ctypes.c_int32 * n_lanes)()

    @property
    def draft_model(self):
        """The draft model's llama_model (None without one)."""
        return self._draft_model.model if self._draft_model else None

    def _check(self, rc: int, what: str) -> None:
        if rc < 0:
            raise RuntimeError(f"libarbor-spec: {what} failed")

    def begin(self, lane: int, tokens: list[int]) -> None:
        arr = (llama_cpp.llama_token * max(1, len(tokens)))(*tokens)
        self._check(self._lib.arbor_spec_begin(self._h, lane, arr, len(tokens)), f"begin lane {lane}")

    def push(self, lane: int, tokens: list[int]) -> None:
        if tokens:
            arr = (llama_cpp.llama_token * len(tokens))(*tokens)
            self._check(self._lib.arbor_spec_push(self._h, lane, arr, len(tokens)), f"push lane {lane}")

    def draft(self, requests: list[DraftRequest]) -> list[list[int]]:
        """One draft per request (empty: the drafters found none), in order."""
        n = len(requests)
        if n == 0:
            return []
        stride = max(1, self.n_max)
        for i, r in enumerate(requests):
            self._lanes[i], self._id_last[i], self._pos0[i] = r.lane, r.id_last, r.pos0
            self._n_max[i] = min(r.n_max, stride)
        err = ctypes.c_void_p()
        rc = self._lib.arbor_spec_draft(self._h, n, self._lanes, self._id_last, self._pos0, self._n_max, self._out,
                                        stride, self._out_n, ctypes.byref(err))
        if rc < 0:
            raise RuntimeError(f"libarbor-spec: drafting failed: {take_error(err, 'no reason given')}")
        return [list(self._out[i * stride: i * stride + self._out_n[i]]) for i in range(n)]

    def accept(self, lane: int, n_accepted: int) -> None:
        self._check(self._lib.arbor_spec_accept(self._h, lane, n_accepted), f"accept lane {lane}")

    def close(self) -> None:
        if self._h:
            self._lib.arbor_spec_free(self._h)
            self._h = None
        if self._draft_model:
            self._draft_model.close()
            self._draft_model = None
