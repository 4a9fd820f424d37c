"""A sequence state restored in two steps: its cells taken on the engine thread, its K and V written on another thread
while llama.cpp computes other sequences (native/src/llama-state-staged.h, our patched libllama).

Contract:
- `compiled_in()` says whether the loaded libllama has the staged restore (the C symbol `llama_state_seq_stage`); it
  never raises.
- `stage(ctx, data, seq_id)` reads the state's metadata into `seq_id`'s cells (positions, sequence ids, every check
  llama_state_seq_set_data makes) and returns a `StagedState`, or None when llama.cpp refused the state (no room, a
  state of another cache): nothing is left in the sequence then. `data` is any contiguous buffer; the StagedState
  keeps a reference to it until written.
- `StagedState.write()` copies the K and V ranges, once, on any thread; `free()` (idempotent) releases the native
  record, written or not. Until `write()` has returned, the sequence's cells hold stale data: the caller keeps the
  sequence out of batches and keeps every other call off the KV (LlamaRuntime.settle_writes).
"""

from __future__ import annotations

import ctypes
from functools import cache

import llama_cpp
import numpy as np


@cache
def _functions():
    lib = llama_cpp.llama_cpp._lib
    try:
        stage_fn, n_bytes_fn = lib.llama_state_seq_stage, lib.llama_state_staged_n_bytes
        write_fn, free_fn = lib.llama_state_staged_write, lib.llama_state_staged_free
    except AttributeError:
        return None
    stage_fn.argtypes = [ctypes.c_void_p, ctypes.POINTER(ctypes.c_uint8), ctypes.c_size_t, ctypes.c_int32,
                         ctypes.POINTER(ctypes.c_size_t)]
    stage_fn.restype = ctypes.c_void_p
    n_bytes_fn.argtypes, n_bytes_fn.restype = [ctypes.c_void_p], ctypes.c_size_t
    write_fn.argtypes, write_fn.restype = [ctypes.c_void_p], ctypes.c_int32
    free_fn.argtypes, free_fn.restype = [ctypes.c_void_p], None
    return stage_fn, n_bytes_fn, write_fn, free_fn


def compiled_in() -> bool:
    return _functions() is not None


class StagedState:
    """One staged sequence state: its cells are taken, its K and V not written yet."""

    def __init__(self, handle: int, data: np.ndarray, n_bytes: int):
        self._handle: int | None = handle
        self._data: np.ndarray | None = data  # the state the write reads: alive until written
        self.n_bytes = n_bytes  # what the write copies (the state's K and V)
        self.written = False

    def write(self) -> None:
        if self._handle is None or self.written:
            raise RuntimeError("a staged state is written once, before it is freed")
        fns = _functions()
        assert fns is not None  # staged by this library
        fns[2](self._handle)
        self.written = True
        self._data = None

    def free(self) -> None:
        if self._handle is not None:
            fns = _functions()
            assert fns is not None
            fns[3](self._handle)
            self._handle = None
            self._data = None


def stage(ctx, data, seq_id: int) -> StagedState | None:
    fns = _functions()
    if fns is None:
        raise RuntimeError("this libllama lacks llama_state_seq_stage: it was not built by scripts/setup.sh with "
                           "Arbor's native sources (native/src/llama-state-staged.cpp)")
    arr = np.frombuffer(data, dtype=np.uint8)
    n_read = ctypes.c_size_t(0)
    handle = fns[0](ctx, arr.ctypes.data_as(ctypes.POINTER(ctypes.c_uint8)), arr.nbytes, seq_id, ctypes.byref(n_read))
    if not handle:
        return None
    return StagedState(handle, arr, int(fns[1](handle)))
