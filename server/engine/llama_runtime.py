"""The one place that owns llama.cpp's model and context (through llama-cpp-python's ctypes API).

Contract:
- One model, one context. Its KV is unified (`kv_unified`, a single stream shared by every
  sequence, so `seq_cp` shares cells instead of copying them: the basis of resident prefix
  sharing) or split (a stream per sequence id, `--kv-layout split`: server/engine/kv_layout.py),
  where `copy_prefix` copies another stream's prefix. The layout may be chosen once the model
  and its devices are known, before the context is created (`shape`).
- Split layout: llama.cpp copies between streams whole, when the next batch is computed (its
  seq_cp of a range across streams aborts the process: `seq_cp` refuses it here). Until that
  decode, a stream a copy reads from or writes to must not have its state written, nor a stream
  a copy writes to be read: `state_seq_get` / `state_seq_set` there first have llama.cpp make
  the copies (`make_copies`: one token decoded into that sequence past its end and removed
  again), counted in `copies_made_early`.
- Every method except the tokenizer ones must be called from the engine thread only;
  llama.cpp contexts are not thread-safe. Tokenization reads the vocabulary only and may
  be called from any thread.
- ctypes releases the GIL during foreign calls, so a decode running on the engine thread
  does not stall the HTTP event loop.
- A staged state (`stage_state`, then `write_staged`: native/src/llama-state-staged.h) has its cells
  taken on the engine thread and its K and V written on the runtime's write thread while decodes of
  other sequences run; only where `stages_beside_compute` (paged attention on the CPU: kernels that
  never read a cell masked for them). Until its write is done the caller keeps the sequence out of
  batches; a method here that reads or frees the cells of a sequence a write fills, or may move any
  cell, waits for that write first (`settle_writes`), so no cell is freed, moved or read while written.
  The mirror, a snapshot read (`snapshot_state`, then `read_snapshot`): the state's metadata written on
  the engine thread, its K and V copied out on the same thread as the writes; the sequence's cells are
  kept as they are until the read is done (`settle_writes` waits for it too).
"""

from __future__ import annotations

import ctypes
import logging
import os
import time
from collections.abc import Callable, Iterable
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

import llama_cpp
import numpy as np

from server.engine import backend_devices, kv_layout, kv_types, offload, paged_attention, staged_state
from server.engine.kv_full import KVCacheFull
from server.engine.llama_backend import init_once as _init_backend_once
from server.engine.model_info import ModelInfo, read_model_info
from server.engine.model_weights import matmul_weights, read_tensor_types

# the SWA cells or recurrent state of a sequence, without its full-attention KV
_PARTIAL_ONLY = llama_cpp.LLAMA_STATE_SEQ_FLAGS_PARTIAL_ONLY

log = logging.getLogger(__name__)

# llama.cpp refuses more sequences than this per context (LLAMA_MAX_SEQ).
LLAMA_MAX_SEQ = 256

def _log_offload(report: offload.OffloadReport) -> None:
    """The start-up lines that say where the model runs (WARNING when something meant for an
    accelerator runs on the CPU, so it shows at every log level but error)."""
    log.log(logging.WARNING if report.cpu_fallback else logging.INFO, "%s", report.log_line())
    for message in (report.weights_warning(), *report.notes):
        if message:
            log.warning("%s", message)


class ModelLoadError(RuntimeError):
    """The model file could not be loaded or its context could not be created."""


class UnsupportedModel(RuntimeError):
    """The model's architecture or memory type is not supported for the requested use."""


class StreamCopyPending(RuntimeError):
    """A copy between split KV streams that llama.cpp has not made yet involves this sequence's stream, and it
    could not be made now."""


@dataclass(frozen=True)
class RuntimeConfig:
    """What the context is created with. `n_ctx` counts cells of the unified KV."""

    model_path: Path
    n_ctx: int
    n_batch: int
    n_seq_max: int
    n_threads: int
    n_threads_batch: int
    n_gpu_layers: int = 0
    flash_attn: bool | None = None  # None: llama.cpp decides
    cache_type_k: str = "f16"  # the KV cache's element types, llama-server's names (server/engine/kv_types.py)
    cache_type_v: str = "f16"
    kv_unified: bool = True
    # sliding-window layers keep every cell (llama.cpp's default, llama-server's --swa-full); off,
    # they keep their window and a slot goes back with state checkpoints (server/cache/checkpoints.py)
    swa_full: bool = False
    # paged attention over the unified KV (server/engine/paged_attention.py): auto = on where the backend has it
    paged_attn: Literal["auto", "on", "off"] = "auto"
    page_size: int = 16  # cells per page
    # where tokens go with pages on: "shared" (llama.cpp's next free cells) or "owned" (each sequence fills pages of its
    # own, native/src/llama-kv-pages.cpp). The server passes its --page-placement (default owned, measured faster at the
    # seed's shape: docs/paged-attention.md); direct users of the runtime (tests, benches) keep llama.cpp's placement
    page_placement: Literal["owned", "shared"] = "shared"


@dataclass
class BatchEntry:
    """One token placed in a decode batch."""

    token: int
    pos: int
    seq_id: int
    want_logits: bool


class DecodeError(RuntimeError):
    """llama_decode failed; `code` is its return value (1: no KV slot, 2: aborted, <0: fatal)."""

    def __init__(self, code: int):
        super().__init__(f"llama_decode failed with code {code}")
        self.code = code


class _OwnedBatch:
    """A llama_batch whose arrays Python owns (one token per entry, one sequence per token).

    llama_batch_init gives every token its own malloc'd seq_id array, which can only be
    written one element at a time; here all seq ids live in one contiguous array, so each
    field is filled with one slice assignment. Freed with the object, not llama_batch_free.
    """

    def __init__(self, capacity: int):
        self.token = (llama_cpp.llama_token * capacity)()
        self.pos = (llama_cpp.llama_pos * capacity)()
        self.n_seq_id = (ctypes.c_int32 * capacity)(*([1] * capacity))
        self.seq = (llama_cpp.llama_seq_id * capacity)()
        size = ctypes.sizeof(llama_cpp.llama_seq_id)
        base = ctypes.addressof(self.seq)
        seq_ptr = ctypes.POINTER(llama_cpp.llama_seq_id)
        self.seq_ptrs = (seq_ptr * capacity)(*(ctypes.cast(base + i * size, seq_ptr) for i in range(capacity)))
        self.logits: ctypes.Array[Any] = (ctypes.c_int8 * capacity)()
        self.batch = llama_cpp.llama_batch(
            n_tokens=0, token=self.token, embd=None, pos=self.pos, n_seq_id=self.n_seq_id,
            seq_id=self.seq_ptrs, logits=self.logits,
        )


class LlamaRuntime:
    """Model + context + a reusable batch buffer, and thin typed wrappers over the C API."""

    def __init__(self, config: RuntimeConfig,
                 shape: Callable[[ModelInfo, offload.OffloadReport], RuntimeConfig] | None = None):
        """`shape`: called with the model's facts and where its layers run, once both are known and before the
        context is created, it returns the config the context is made with (its KV layout, cells and sequences:
        server/bootstrap.py); it may raise to refuse, and the model is freed."""
        _init_backend_once()
        self.config = config
        mparams = llama_cpp.llama_model_default_params()
        mparams.n_gpu_layers = config.n_gpu_layers
        self.model = llama_cpp.llama_model_load_from_file(str(config.model_path).encode(), mparams)
        if not self.model:
            raise ModelLoadError(f"could not load model file {config.model_path}")
        # Where layers and matmuls run, from the devices ggml opened and the file's weight types:
        # llama.cpp says it only in INFO/DEBUG lines, which are filtered out (offload.py).
        try:
            self.devices = backend_devices.inventory()
            self.offload = offload.plan(config.n_gpu_layers, int(llama_cpp.llama_model_n_layer(self.model)),
                                        self.devices, matmul_weights(read_tensor_types(config.model_path)),
                                        build_soc=os.environ.get("ARBOR_CANN_SOC_TYPE") or None)
        except Exception:
            llama_cpp.llama_model_free(self.model)
            raise
        _log_offload(self.offload)
        self.vocab = llama_cpp.llama_model_get_vocab(self.model)
        self.n_vocab = int(llama_cpp.llama_vocab_n_tokens(self.vocab))
        self._pieces: dict[int, bytes] = {}  # token -> piece (special=False), filled as tokens come out
        self._eog: dict[int, bool] = {}
        self._control: dict[int, bool] = {}
        self.info = read_model_info(self.model, self.vocab, str(self.config.model_path), self.piece)
        try:
            if shape is not None:
                config = self.config = shape(self.info, self.offload)
            if config.n_seq_max > LLAMA_MAX_SEQ:
                raise UnsupportedModel(
                    f"{config.n_seq_max} sequences requested; llama.cpp allows at most {LLAMA_MAX_SEQ} per context"
                )
        except Exception:
            llama_cpp.llama_model_free(self.model)
            raise

        cparams = llama_cpp.llama_context_default_params()
        cparams.n_ctx = config.n_ctx
        cparams.n_batch = config.n_batch
        cparams.n_ubatch = config.n_batch
        cparams.n_seq_max = config.n_seq_max
        cparams.n_threads = config.n_threads
        cparams.n_threads_batch = config.n_threads_batch
        cparams.kv_unified = config.kv_unified
        cparams.swa_full = config.swa_full
        cparams.no_perf = True
        cparams.type_k = kv_types.GGML_TYPE_IDS[config.cache_type_k]
        cparams.type_v = kv_types.GGML_TYPE_IDS[config.cache_type_v]
        if config.flash_attn is not None:
            cparams.flash_attn_type = (
                llama_cpp.LLAMA_FLASH_ATTN_TYPE_ENABLED if config.flash_attn
                else llama_cpp.LLAMA_FLASH_ATTN_TYPE_DISABLED
            )
        self.ctx = llama_cpp.llama_init_from_model(self.model, cparams)
        if not self.ctx:
            llama_cpp.llama_model_free(self.model)
            types = (f", K type {config.cache_type_k}, V type {config.cache_type_v} (llama.cpp needs the head size a "
                     "multiple of a quantized type's block; a quantized V needs flash attention)"
                     if (config.cache_type_k, config.cache_type_v) != ("f16", "f16") else "")
            raise ModelLoadError(
                f"could not create a context with n_ctx={config.n_ctx}, n_seq_max={config.n_seq_max}{types}"
            )
        self.split = not config.kv_unified  # a KV stream per sequence id (server/engine/kv_layout.py)
        self.kv_layout = "split" if self.split else "unified"
        self.n_stream = config.n_seq_max if self.split else 1
        self.n_ctx_seq = int(llama_cpp.llama_n_ctx_seq(self.ctx))  # cells one sequence may hold (a stream's, split)
        # split: sequences a copy between streams involves until the next decode makes it (sources, destinations)
        self._copy_sources: set[int] = set()
        self._copy_targets: set[int] = set()
        self.copies_made_early = 0  # times a state read or write had llama.cpp make the pending copies first
        try:
            if self.split:
                self.paged_attn = self._paged_off_in_split(config)
            else:
                self.paged_attn = paged_attention.configure(self.ctx, config.paged_attn, config.page_size,
                                                            offloaded=self.offload.offloaded > 0,
                                                            kv_types=(config.cache_type_k, config.cache_type_v))
        except paged_attention.PagedAttentionUnavailable:
            llama_cpp.llama_free(self.ctx)
            llama_cpp.llama_model_free(self.model)
            raise
        if paged_attention.compiled_in():
            # kept on the KV cache, so it holds when paging is turned on later (bench/paged_logits.Twin)
            paged_attention.set_owned_pages(self.ctx, config.page_placement == "owned")
        # where paged attention places a step's tokens (None: paging is off)
        self.page_placement = config.page_placement if self.paged_attn.enabled else None
        self.n_cells_defragmented = 0  # cells defragment_pages moved so far (/metrics)
        # Staged states written beside the compute: only where every kernel that reads another sequence's cells
        # skips the cells masked for it (the CPU's flash-attention kernels, which paged attention needs), and the
        # KV is host memory (no layer offloaded: a device copy would need a stream and an event of its own).
        self.stages_beside_compute = (self.paged_attn.enabled and self.offload.offloaded == 0
                                      and staged_state.compiled_in())
        self._writer: ThreadPoolExecutor | None = None  # the transfer thread, made at the first staged write or read
        # staged writes and snapshot reads in flight: (the sequences whose cells they touch, the transfer)
        self._writes: list[tuple[frozenset[int], Future]] = []
        self.writes_waited = 0  # times a call here waited for a staged write (or snapshot read) still running
        if self.paged_attn.note and config.paged_attn == "auto":
            log.warning("paged attention is off: %s", self.paged_attn.note)
        self.memory = llama_cpp.llama_get_memory(self.ctx)
        self.n_ctx = llama_cpp.llama_n_ctx(self.ctx)
        self.n_batch = llama_cpp.llama_n_batch(self.ctx)
        self._batch = _OwnedBatch(self.n_batch)

    def _paged_off_in_split(self, config: RuntimeConfig) -> paged_attention.PagedAttentionStatus:
        """Paged attention pages one unified KV (llama_set_paged_attn refuses split streams): off, with why."""
        note = kv_layout.paged_attention_note(self.offload.backend if self.offload.offloaded else None)
        if config.paged_attn == "on":
            raise paged_attention.PagedAttentionUnavailable(f"--paged-attn on: {note}")
        return paged_attention.PagedAttentionStatus(paged_attention.compiled_in(), 0, note)

    # ---------------------------------------------------------------- tokenizer
    def tokenize(self, text: str, *, add_special: bool, parse_special: bool) -> list[int]:
        data = text.encode("utf-8")
        capacity = len(data) + 16
        buf = (llama_cpp.llama_token * capacity)()
        n = llama_cpp.llama_tokenize(self.vocab, data, len(data), buf, capacity, add_special, parse_special)
        if n < 0:
            capacity = -n
            buf = (llama_cpp.llama_token * capacity)()
            n = llama_cpp.llama_tokenize(self.vocab, data, len(data), buf, capacity, add_special, parse_special)
        return list(buf[:n])

    def piece(self, token: int, *, special: bool = False) -> bytes:
        """The bytes of one token (may be part of a multi-byte UTF-8 character).

        Pieces of generated text (special=False) are memoized: the engine asks for one per
        token per step, and a dict hit costs no foreign call and no allocation. A miss
        allocates its own buffer, so any thread may call this."""
        if not special:
            got = self._pieces.get(token)
            if got is not None:
                return got
        buf = ctypes.create_string_buffer(256)
        n = llama_cpp.llama_token_to_piece(self.vocab, token, buf, len(buf), 0, special)
        if n < 0:
            buf = ctypes.create_string_buffer(-n)
            n = llama_cpp.llama_token_to_piece(self.vocab, token, buf, len(buf), 0, special)
        out = buf.raw[:n]
        if not special and 0 <= token < self.n_vocab:
            self._pieces[token] = out
        return out

    def detokenize(self, tokens: list[int], *, special: bool = False) -> str:
        return b"".join(self.piece(t, special=special) for t in tokens).decode("utf-8", errors="replace")

    def is_eog(self, token: int) -> bool:
        got = self._eog.get(token)
        if got is None:
            got = self._eog[token] = bool(llama_cpp.llama_vocab_is_eog(self.vocab, token))
        return got

    def is_control(self, token: int) -> bool:
        """A control token (a chat template's turn markers: <|im_start|>, <start_of_turn>, ...)."""
        got = self._control.get(token)
        if got is None:
            got = self._control[token] = bool(llama_cpp.llama_vocab_is_control(self.vocab, token))
        return got

    # ------------------------------------------------------------------- decode
    def decode(self, entries: list[BatchEntry]) -> list[int]:
        """Run one llama_decode over `entries` (at most n_batch).

        Returns the batch indices of the entries that asked for logits, in order, for
        sampling with `llama_sampler_sample(smpl, ctx, idx)`. Raises KVCacheFull when the
        unified KV has no room for the batch (nothing was computed), else DecodeError.
        """
        return self.decode_arrays([e.token for e in entries], [e.pos for e in entries],
                                  [e.seq_id for e in entries], [1 if e.want_logits else 0 for e in entries])

    def decode_arrays(self, tokens: list[int], positions: list[int], seq_ids: list[int],
                      logits: list[int]) -> list[int]:
        """`decode` on parallel lists (the engine's per-step path: the batch arrays are
        filled by slice assignment, in C, instead of five ctypes stores per token).
        Same results and errors as `decode`."""
        n = len(tokens)
        if n == 0:
            return []
        if n > self.n_batch:
            raise ValueError(f"batch of {n} tokens exceeds n_batch={self.n_batch}")
        b = self._batch
        b.token[:n] = tokens
        b.pos[:n] = positions
        b.seq[:n] = seq_ids
        b.logits[:n] = logits
        b.batch.n_tokens = n
        rc = llama_cpp.llama_decode(self.ctx, b.batch)
        if self._copy_targets and rc in (0, 1, 2):  # the batch got as far as llama.cpp's memory update
            self._copy_sources.clear()
            self._copy_targets.clear()
        if rc == 1:
            raise KVCacheFull(n)
        if rc != 0:
            raise DecodeError(rc)
        return [i for i, want in enumerate(logits) if want]

    def logits_matrix(self, n_rows: int):
        """The output rows of the last decode as a read-only (n_rows, n_vocab) float32 numpy
        view, in batch order; valid until the next decode."""
        ptr = llama_cpp.llama_get_logits(self.ctx)
        view = np.ctypeslib.as_array(ptr, shape=(n_rows, self.n_vocab))
        view.flags.writeable = False
        return view

    def logits_row(self, batch_index: int) -> ctypes.Array:
        """The logits of one output row (n_vocab floats), valid until the next decode."""
        ptr = llama_cpp.llama_get_logits_ith(self.ctx, batch_index)
        return (ctypes.c_float * self.info.n_vocab).from_address(ctypes.addressof(ptr.contents))

    # ------------------------------------------------------------------- memory
    def seq_rm(self, seq_id: int, p0: int = -1, p1: int = -1) -> bool:
        self.settle_writes(seq_id)
        return bool(llama_cpp.llama_memory_seq_rm(self.memory, seq_id, p0, p1))

    def seq_cp(self, src: int, dst: int, p0: int = -1, p1: int = -1) -> None:
        """llama.cpp's seq_cp. Split layout: only whole sequences (a range across streams would abort the process:
        `copy_prefix` copies and trims), and `dst` loses what it held."""
        if self.split and src != dst:
            if p0 > 0 or 0 <= p1 < self.n_ctx_seq - 1:
                raise ValueError(f"seq_cp({src}, {dst}, {p0}, {p1}): the split KV layout copies whole streams only")
            self._copy_sources.add(src)
            self._copy_targets.add(dst)
        llama_cpp.llama_memory_seq_cp(self.memory, src, dst, p0, p1)

    def copy_prefix(self, src: int, dst: int, n: int) -> None:
        """`dst` holds positions [0, n) of `src` (which holds them). Unified: added to dst's cells, sharing src's
        (no copy). Split: dst's stream is replaced by a copy of src's, made by llama.cpp when the next batch is
        computed, and trimmed to [0, n) (the copy's cost is the whole stream's bytes: CostModel.copy_ms)."""
        if not self.split:
            self.seq_cp(src, dst, 0, n)
            return
        self.seq_cp(src, dst, -1, -1)
        self.seq_rm(dst, n, -1)

    def time_stream_copy(self, src: int, dst: int, repeats: int = 3) -> float:
        """Split layout: the ms a copy of one stream into another adds to the next decode, measured on two empty
        streams before the server serves (one token decoded into `src`, with and without a copy of its stream into
        `dst` pending; the median of `repeats` differences, at least 0). The copy moves a whole stream whatever
        the prefix's length, so this is what tier S costs a request there (server/cache/cost.py). Both
        sequences are left empty. Engine thread (or before the engine starts)."""
        if not self.split:
            return 0.0
        bos = int(llama_cpp.llama_vocab_bos(self.vocab))
        token = bos if bos >= 0 else 0

        def step(copy: bool) -> float:
            if copy:
                self.seq_cp(src, dst, -1, -1)
            t0 = time.perf_counter()
            self.decode([BatchEntry(token, 0, src, True)])
            seconds = time.perf_counter() - t0
            self.seq_rm(src, -1, -1)
            self.seq_rm(dst, -1, -1)
            return seconds

        step(False)  # the first decode's graph and buffers are not the copy's
        diffs = sorted(step(True) - step(False) for _ in range(repeats))
        return max(0.0, diffs[len(diffs) // 2]) * 1000.0

    def copy_pending(self, seq_id: int) -> bool:
        """A copy between split streams that llama.cpp has not made yet reads from or writes to this sequence."""
        return seq_id in self._copy_sources or seq_id in self._copy_targets

    def make_copies(self, via: int) -> None:
        """Have llama.cpp make the pending copies between split streams now: it makes them at the start of a
        decode, so one token (no logits) is decoded into `via` just past its last position, then removed again;
        its stream's cells are as they were, whatever it held (its data is copied before the token is
        computed). Raises StreamCopyPending if the decode failed before llama.cpp got to the copies."""
        if not self._copy_targets:
            return
        pos = self.seq_pos_max(via) + 1
        bos = int(llama_cpp.llama_vocab_bos(self.vocab))
        try:
            self.decode_arrays([bos if bos >= 0 else 0], [pos], [via], [0])
        except KVCacheFull:
            pass  # a full stream: llama.cpp made the copies before it looked for room
        except DecodeError as exc:
            raise StreamCopyPending(f"the pending copies between KV streams could not be made: {exc}") from exc
        finally:
            self.seq_rm(via, pos, -1)
        if self._copy_targets:
            raise StreamCopyPending("the pending copies between KV streams could not be made")
        self.copies_made_early += 1

    def seq_pos_max(self, seq_id: int) -> int:
        return int(llama_cpp.llama_memory_seq_pos_max(self.memory, seq_id))

    def seq_pos_min(self, seq_id: int) -> int:
        return int(llama_cpp.llama_memory_seq_pos_min(self.memory, seq_id))

    def seq_pages(self, seq_id: int) -> list[int] | None:
        """The pages of KV cells seq_id's attention walks (paged attention); None when it is off."""
        return paged_attention.seq_pages(self.ctx, seq_id)

    def defragment_pages(self) -> int:
        """With pages owned by one sequence, move the cells a full cache placed among another sequence's cells
        into pages of their own sequences, as far as free cells allow (llama_paged_attn_defrag); between decodes
        only (the engine thread). Returns the cells moved: 0 with paging off, llama.cpp's placement or nothing
        to move."""
        if self.page_placement != "owned":
            return 0
        self.settle_writes()
        moved = paged_attention.defragment(self.ctx)
        self.n_cells_defragmented += moved
        return moved

    def paged_self_check(self) -> paged_attention.SelfCheck | None:
        """Whether llama.cpp checks every paged mask (LLAMA_PAGED_ATTN_SELF_CHECK, debug builds) and its failures;
        None without paged attention or a plain KV cache. Read from any thread: two plain fields."""
        if not self.paged_attn.enabled:
            return None
        return paged_attention.self_check(self.ctx)

    def state_seq_get(self, seq_id: int, *, partial: bool = False) -> memoryview:
        """The serialized KV state of one sequence (llama.cpp's own format), or of the whole
        context for seq_id -1. llama.cpp writes straight into a fresh, uninitialised buffer:
        the only copy is its own device-to-host one. `partial`: only what the full-attention
        KV cannot rebuild, the sliding-window layers' cells or the recurrent state
        (LLAMA_STATE_SEQ_FLAGS_PARTIAL_ONLY; server/cache/checkpoints.py)."""
        if seq_id in self._copy_targets:  # its stream is still to receive a copy
            self.make_copies(seq_id)
        self.settle_writes(seq_id)
        flags = _PARTIAL_ONLY if partial else 0
        size = llama_cpp.llama_state_seq_get_size_ext(self.ctx, seq_id, flags)
        buf = np.empty(size, dtype=np.uint8)
        n = llama_cpp.llama_state_seq_get_data_ext(self.ctx, buf.ctypes.data_as(ctypes.POINTER(ctypes.c_uint8)),
                                                   size, seq_id, flags)
        return buf.data[:n]

    def state_seq_size(self, seq_id: int) -> int:
        """The bytes `state_seq_get(seq_id)` would return (llama.cpp sizes the state by walking
        the sequence's cells, without copying the KV)."""
        return int(llama_cpp.llama_state_seq_get_size_ext(self.ctx, seq_id, 0))

    def state_seq_set(self, data, seq_id: int, *, partial: bool = False) -> bool:
        """Restore a sequence state into `seq_id` (llama.cpp clears that sequence first: with
        `partial`, only its sliding-window cells or recurrent state). `data` is any contiguous
        buffer (bytes, bytearray, memoryview, numpy); it is passed by address, never copied here."""
        if self.copy_pending(seq_id):  # a copy would read what this writes, or overwrite it
            self.make_copies(seq_id)
        self.settle_writes(seq_id)
        arr = np.frombuffer(data, dtype=np.uint8)
        ptr = arr.ctypes.data_as(ctypes.POINTER(ctypes.c_uint8))
        return llama_cpp.llama_state_seq_set_data_ext(self.ctx, ptr, arr.nbytes, seq_id,
                                                      _PARTIAL_ONLY if partial else 0) > 0

    def stage_state(self, data, seq_id: int) -> staged_state.StagedState | None:
        """The first step of a two-step restore into the empty `seq_id`: its cells taken, positions and sequence ids
        set, every check made; its K and V not written (`write_staged`). None: llama.cpp refused the state, and the
        sequence holds nothing. Only where `stages_beside_compute` (else RuntimeError: the write could not run beside
        a decode)."""
        if not self.stages_beside_compute:
            raise RuntimeError("staged restores need paged attention on the CPU (the kernels that skip masked cells)")
        return staged_state.stage(self.ctx, data, seq_id)

    def write_staged(self, staged: staged_state.StagedState, seq_ids: Iterable[int]) -> Future:
        """Write a staged state's K and V on the write thread, now, while the engine thread goes on; the future
        gives the write's seconds. `seq_ids`: the sequences that hold the staged cells by now (seq_cp may have
        given them to another since staging). The record is freed when the write is done."""
        def write() -> float:
            t0 = time.perf_counter()
            try:
                staged.write()
            finally:
                staged.free()
            return time.perf_counter() - t0

        future = self._transfer_thread().submit(write)
        self._writes.append((frozenset(seq_ids), future))
        return future

    def snapshot_state(self, seq_id: int) -> staged_state.StateSnapshot | None:
        """The first step of a two-step read of `seq_id`'s state (`read_snapshot`): its metadata written, its tensor
        ranges recorded, nothing copied. None: llama.cpp could not write the state. Only where
        `stages_beside_compute` (else RuntimeError)."""
        if not self.stages_beside_compute:
            raise RuntimeError("snapshot reads need paged attention on the CPU and no offloaded layer")
        self.settle_writes(seq_id)
        return staged_state.snapshot(self.ctx, seq_id)

    def read_snapshot(self, snap: staged_state.StateSnapshot, seq_id: int) -> Future:
        """Copy a snapshot's state out on the transfer thread, now, while the engine thread goes on; the future gives
        the state's bytes (what `state_seq_get(seq_id)` gave when it was taken). `seq_id`'s cells are kept as they
        are until then: seq_rm of it, state calls on it and moves of cells wait for the read (`settle_writes`). The
        snapshot is freed when the read is done."""
        def read() -> memoryview:
            try:
                return snap.read()
            finally:
                snap.free()

        future = self._transfer_thread().submit(read)
        self._writes.append((frozenset((seq_id,)), future))
        return future

    def _transfer_thread(self) -> ThreadPoolExecutor:
        if self._writer is None:
            self._writer = ThreadPoolExecutor(max_workers=1, thread_name_prefix="arbor-kv-write")
        return self._writer

    def settle_writes(self, seq_id: int = -1) -> None:
        """Wait for the staged writes into `seq_id`'s cells, and the snapshot reads of them, in flight (-1: every one):
        called, on the engine thread, by the methods here that free or read a sequence's cells, or may move any cell.
        Another request's transfer is waited for only when its cells are touched."""
        if not self._writes:
            return
        waiting = [(seqs, f) for seqs, f in self._writes if seq_id < 0 or seq_id in seqs]
        if any(not f.done() for _, f in waiting):
            self.writes_waited += 1
        for _, f in waiting:
            f.exception()  # waits; a failed write shows where its future is read
        self._writes = [(seqs, f) for seqs, f in self._writes if not f.done()]

    # ---------------------------------------------------------------- lifecycle
    def close(self) -> None:
        writer = getattr(self, "_writer", None)
        if writer is not None:  # no write may outlive the context it fills
            self.settle_writes()
            writer.shutdown(wait=True)
            self._writer = None
        if getattr(self, "ctx", None):
            llama_cpp.llama_free(self.ctx)
            self.ctx = None
        if getattr(self, "model", None):
            llama_cpp.llama_model_free(self.model)
            self.model = None
