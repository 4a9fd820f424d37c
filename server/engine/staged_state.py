"""A sequence state restored in two steps: its cells taken on the engine thread, its K and V written on another thread
while llama.cpp computes other sequences (native/src/llama-state-staged.h, our patched libllama); and, the mirror, a
sequence state read in two steps: its metadata snapshotted on the engine thread, its K and V copied out on another.

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
- `snapshot(ctx, seq_id)` runs llama.cpp's state writer for `seq_id` keeping its metadata and recording its tensor
  ranges: a `StateSnapshot`, or None when llama.cpp could not write the state. `StateSnapshot.read()` (any thread,
  once or more) returns the bytes `llama_state_seq_get_data` would have written then; until it has returned, the
  sequence's cells must stay as they are (no seq_rm of it, no move of cells: LlamaRuntime.settle_writes).
  `compiled_in()` covers both (one native file).
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
        snap_fn, snap_size_fn = lib.llama_state_seq_snapshot, lib.llama_state_snapshot_size
        snap_read_fn, snap_free_fn = lib.llama_state_snapshot_read, lib.llama_state_snapshot_free
    except AttributeError:
        return None
    snap_fn.argtypes, snap_fn.restype = [ctypes.c_void_p, ctypes.c_int32], ctypes.c_void_p
    snap_size_fn.argtypes, snap_size_fn.restype = [ctypes.c_void_p], ctypes.c_size_t
    snap_read_fn.argtypes = [ctypes.c_void_p, ctypes.POINTER(ctypes.c_uint8), ctypes.c_size_t]
    snap_read_fn.restype = ctypes.c_size_t
    snap_free_fn.argtypes, snap_free_fn.restype = [ctypes.c_void_p], None
    stage_fn.argtypes = [ctypes.c_void_p, ctypes.POINTER(ctypes.c_uint8), ctypes.c_size_t, ctypes.c_int32,
                         ctypes.POINTER(ctypes.c_size_t)]
    stage_fn.restype = ctypes.c_void_p
    n_bytes_fn.argtypes, n_bytes_fn.restype = [ctypes.c_void_p], ctypes.c_size_t
    write_fn.argtypes, write_fn.restype = [ctypes.c_void_p], ctypes.c_int32
    free_fn.argtypes, free_fn.restype = [ctypes.c_void_p], None
    return stage_fn, n_bytes_fn, write_fn, free_fn, snap_fn, snap_size_fn, snap_read_fn, snap_free_fn


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


class StateSnapshot:
    """One sequence state snapshotted: its metadata kept, its K and V still in the sequence's cells."""

    def __init__(self, handle: int, size: int):
        self._handle: int | None = handle
        self.size = size  # the state's bytes, llama_state_seq_get_size's

    def read(self) -> memoryview:
        """The state's bytes, copied now (any thread) into a fresh buffer."""
        if self._handle is None:
            raise RuntimeError("a state snapshot is read before it is freed")
        fns = _functions()
        assert fns is not None  # snapshotted by this library
        buf = np.empty(self.size, dtype=np.uint8)
        n = fns[6](self._handle, buf.ctypes.data_as(ctypes.POINTER(ctypes.c_uint8)), buf.nbytes)
        if n != self.size:
            raise RuntimeError(f"reading a state snapshot gave {n} of its {self.size} bytes")
        return buf.data

    def free(self) -> None:
        if self._handle is not None:
            fns = _functions()
            assert fns is not None
            fns[7](self._handle)
            self._handle = None


def snapshot(ctx, seq_id: int) -> StateSnapshot | None:
    fns = _functions()
    if fns is None:
        raise RuntimeError("this libllama lacks llama_state_seq_snapshot: it was not built by scripts/setup.sh with "
                           "Arbor's native sources (native/src/llama-state-staged.cpp)")
    handle = fns[4](ctx, seq_id)
    if not handle:
        return None
    return StateSnapshot(handle, int(fns[5](handle)))
