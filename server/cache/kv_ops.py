"""KV moves between live sequences and stored segments (engine thread only).

- `extract(src, start, end)`: the KV of positions [start, end) of a live sequence, as a
  segment: seq_cp into a scratch sequence (shares cells, copies nothing), read that
  sequence's state into one buffer (llama.cpp's own copy; the segment is views over it),
  drop the scratch.
- `restore(segments, target)`: the segments of one radix path joined into one state
  (no copy when it is a single segment that is still its whole extracted blob, else one
  copy per layer into a new blob), restored into a scratch sequence at their original
  positions, then attached to the target with seq_cp and the scratch dropped. Raises RestoreError after clearing what
  it touched, so the caller can fall back to computing the tokens.
- `joined(segments)` (any thread: the copy, into a kept buffer) then `stage(joined, target)`: `restore` in
  two steps (unified layout, full-attention models, where `runtime.stages_beside_compute`): the cells are
  taken and attached to the target at once (the engine thread), their K and V written on the runtime's
  write thread while the engine computes other sequences; the target must stay out of batches until
  `written` is done.
- `extract_beside(src, start, end, hold)`: `extract` in two steps, its mirror (same conditions): positions
  [start, end) attached to the empty sequence `hold` and its state snapshotted (the engine thread), the K and
  V copied out on the runtime's transfer thread; `PendingExtract.segment()` gives the segment once read. The
  caller keeps `hold` until then and gives it back after (seq_rm of it waits for the read).

Every scratch sequence id is given back on every path (the pool's `in_use` shows leaks).

In the split KV layout (server/engine/kv_layout.py) a scratch sequence would be a stream of its
own, and a copy between streams replaces the whole destination stream: so there is no scratch.
`extract` reads the source sequence's state whole and keeps [start, end) of it (one copy of
that part when it is not the whole); `restore` writes a state starting at position 0 straight
into the emptied target's stream (the router restores from 0 there: server/cache/restore.py).
A stream that a copy not yet made involves is neither read nor written (StreamCopyPending):
ExtractError or RestoreError, and the tokens are computed.
"""

from __future__ import annotations

import time
from concurrent.futures import Future
from dataclasses import dataclass
from typing import Any

import numpy as np

from server.cache.checkpoints import StateCheckpoint
from server.cache.kv_format import (
    KVFormatError,
    KVSegment,
    count_state_cells,
    parse_seq_state,
    state_blob,
    with_partial_state,
)
from server.cache.staging_buffers import StagingBuffers
from server.engine.llama_runtime import LlamaRuntime, StreamCopyPending
from server.engine.seq_ids import SequenceIdPool, SequenceIdsExhausted


class RestoreError(RuntimeError):
    """Restoring KV failed; the target holds nothing from the attempt."""


class ExtractError(RuntimeError):
    """Reading KV out of a sequence failed; nothing was stored."""


@dataclass(frozen=True)
class RestoreResult:
    n_tokens: int
    nbytes: int
    ms: float


@dataclass(frozen=True)
class JoinedState:
    """Segments joined into one sequence state, ready to stage (KVOps.joined)."""

    blob: Any  # the state (a buffer llama.cpp reads)
    start: int  # it holds positions [start, end)
    end: int
    buffer: np.ndarray | None  # the kept buffer it is in (given back once written); None: a segment's own blob


@dataclass(frozen=True)
class StagedRestore:
    n_tokens: int
    nbytes: int
    stage_ms: float  # the engine thread's part: the cells taken and attached
    written: Future  # done when the target's cells hold the K and V (its result: the write's seconds)


@dataclass(frozen=True)
class PendingExtract:
    """The KV of positions [start, end), being copied out beside the compute (KVOps.extract_beside)."""

    start: int
    end: int
    hold_seq: int  # holds the cells until the read is done; the caller gives it back
    read: Future  # its result: the state's bytes

    def segment(self) -> KVSegment:
        """The segment (waits for the read). Raises ExtractError."""
        try:
            seg = parse_seq_state(self.read.result())
        except KVFormatError as exc:
            raise ExtractError(f"unexpected KV state format: {exc}") from exc
        except RuntimeError as exc:
            raise ExtractError(str(exc)) from exc
        if seg.pos0 != self.start or seg.n_tokens != self.end - self.start:
            raise ExtractError(f"asked for positions [{self.start}, {self.end}), the read held "
                               f"[{seg.pos0}, {seg.pos0 + seg.n_tokens})")
        return seg


class KVOps:
    def __init__(self, runtime: LlamaRuntime, seq_ids: SequenceIdPool, *, partial_state: bool = False):
        self.runtime = runtime
        self.seq_ids = seq_ids
        # a model with sliding-window or recurrent layers: segments are its full-attention KV
        # (the state's first section), and a restore needs a state checkpoint for the rest
        self.partial_state = partial_state
        # the split KV layout: a stream per sequence, no scratch; states are written for its stream count
        self.split = runtime.split
        self.streams = runtime.n_stream
        self.buffers = StagingBuffers()  # the joins of staged restores (`joined`)

    def extract(self, src_seq: int, start: int, end: int) -> KVSegment:
        if self.split:
            return self._extract_whole(src_seq, start, end)
        try:
            scratch = self.seq_ids.take("scratch")
        except SequenceIdsExhausted as exc:
            raise ExtractError(str(exc)) from exc
        try:
            self.runtime.seq_cp(src_seq, scratch, start, end)
            blob = self.runtime.state_seq_get(scratch)
            seg = parse_seq_state(blob, more_sections=self.partial_state)
        except KVFormatError as exc:
            raise ExtractError(f"unexpected KV state format: {exc}") from exc
        finally:
            self.runtime.seq_rm(scratch, -1, -1)
            self.seq_ids.give("scratch", scratch)
        if seg.pos0 != start or seg.n_tokens != end - start:
            raise ExtractError(f"asked for positions [{start}, {end}), the sequence held "
                               f"[{seg.pos0}, {seg.pos0 + seg.n_tokens})")
        return seg

    def _extract_whole(self, src_seq: int, start: int, end: int) -> KVSegment:
        """Split layout: the source's whole state, cut to [start, end) (a copy of that part unless it is all)."""
        try:
            seg = parse_seq_state(self.runtime.state_seq_get(src_seq), more_sections=self.partial_state)
        except KVFormatError as exc:
            raise ExtractError(f"unexpected KV state format: {exc}") from exc
        except StreamCopyPending as exc:
            raise ExtractError(str(exc)) from exc
        if seg.pos0 > start or seg.pos0 + seg.n_tokens < end:
            raise ExtractError(f"asked for positions [{start}, {end}), the sequence held "
                               f"[{seg.pos0}, {seg.pos0 + seg.n_tokens})")
        if (start, end) == (seg.pos0, seg.pos0 + seg.n_tokens):
            return seg
        return seg.slice(start - seg.pos0, end - seg.pos0).compact()

    def restore(self, segments: list[KVSegment], target_seq: int,
                checkpoint: StateCheckpoint | None = None) -> RestoreResult:
        """Attach the joined segments to `target_seq` (which must not hold those positions). With
        `partial_state`, the segments start at 0, the target is empty and `checkpoint` is the
        state at their end (its window cells or recurrent state are restored with them)."""
        t0 = time.perf_counter()
        if self.partial_state and (checkpoint is None or segments[0].pos0 != 0
                                   or checkpoint.pos != sum(s.n_tokens for s in segments)):
            raise RestoreError("this model's KV restores only from position 0 with a checkpoint at its end")
        try:
            blob = segments[0].to_state_blob(self.streams) if len(segments) == 1 else state_blob(segments, self.streams)
            if checkpoint is not None:
                blob = memoryview(with_partial_state(blob, checkpoint.blob))
        except KVFormatError as exc:
            raise RestoreError(str(exc)) from exc
        start = segments[0].pos0
        end = start + sum(s.n_tokens for s in segments)
        if self.split:
            return self._restore_into(blob, target_seq, start, end, t0)
        try:
            scratch = self.seq_ids.take("scratch")
        except SequenceIdsExhausted as exc:
            raise RestoreError(str(exc)) from exc
        try:
            if not self.runtime.state_seq_set(blob, scratch):
                raise RestoreError("llama.cpp refused the restored state (no room in the KV cache?)")
            if self.runtime.seq_pos_max(scratch) != end - 1:
                raise RestoreError("restored state does not end where the segments do")
            self.runtime.seq_cp(scratch, target_seq, start, end)
        except RestoreError:
            self.runtime.seq_rm(target_seq, start, -1)
            raise
        finally:
            self.runtime.seq_rm(scratch, -1, -1)
            self.seq_ids.give("scratch", scratch)
        return RestoreResult(end - start, len(blob), (time.perf_counter() - t0) * 1000.0)

    @property
    def stages(self) -> bool:
        """Whether `stage` may be used: the unified layout, a full-attention model, the runtime able to write beside a
        decode."""
        return not (self.split or self.partial_state) and self.runtime.stages_beside_compute

    def joined(self, segments: list[KVSegment]) -> JoinedState:
        """The segments as one state to stage: a single segment's own blob, else a copy into a kept buffer (`buffers`).
        Pure (no llama.cpp call): any thread. Raises RestoreError."""
        seg0, taken = segments[0], []

        def take(nbytes: int):
            taken.append(self.buffers.take(nbytes))
            return taken[-1]

        try:
            if len(segments) == 1 and seg0.blob is not None and seg0.blob_streams == self.streams:
                blob = seg0.blob
            else:
                blob = state_blob(segments, self.streams, take=take)
        except KVFormatError as exc:
            for buf in taken:
                self.buffers.give(buf)
            raise RestoreError(str(exc)) from exc
        return JoinedState(blob, seg0.pos0, seg0.pos0 + sum(s.n_tokens for s in segments),
                           taken[0] if taken else None)

    def stage(self, joined: JoinedState, target_seq: int) -> StagedRestore:
        """Attach a joined state's cells to `target_seq` (which must not hold those positions) now and write their K and
        V beside the compute; its buffer is given back once written. Raises RestoreError as `restore` does, the target
        then holding nothing of them."""
        if not self.stages:
            raise RestoreError("a staged restore needs the unified layout, a full-attention model and paged "
                               "attention on the CPU")
        t0 = time.perf_counter()
        start, end = joined.start, joined.end
        staged = None
        try:
            try:
                scratch = self.seq_ids.take("scratch")
            except SequenceIdsExhausted as exc:
                raise RestoreError(str(exc)) from exc
            try:
                staged = self.runtime.stage_state(joined.blob, scratch)
                if staged is None:
                    raise RestoreError("llama.cpp refused the restored state (no room in the KV cache?)")
                if self.runtime.seq_pos_max(scratch) != end - 1:
                    raise RestoreError("restored state does not end where the segments do")
                self.runtime.seq_cp(scratch, target_seq, start, end)
            finally:
                self.runtime.seq_rm(scratch, -1, -1)  # the target keeps the cells; nothing is written to them yet
                self.seq_ids.give("scratch", scratch)
        except RestoreError:
            if staged is not None:
                staged.free()
            self.runtime.seq_rm(target_seq, start, -1)
            if joined.buffer is not None:
                self.buffers.give(joined.buffer)
            raise
        written = self.runtime.write_staged(staged, (target_seq,))
        if joined.buffer is not None:
            buffer = joined.buffer
            written.add_done_callback(lambda _: self.buffers.give(buffer))
        return StagedRestore(end - start, staged.n_bytes, (time.perf_counter() - t0) * 1000.0, written)

    def extract_beside(self, src_seq: int, start: int, end: int, hold_seq: int) -> PendingExtract:
        """Positions [start, end) of `src_seq` attached to the empty `hold_seq` and read out on the transfer thread
        (only where `stages`). Raises ExtractError, `hold_seq` then empty again."""
        if not self.stages:
            raise ExtractError("a read beside the compute needs the unified layout, a full-attention model and "
                               "paged attention on the CPU")
        self.runtime.seq_cp(src_seq, hold_seq, start, end)
        snap = None
        if self.runtime.seq_pos_min(hold_seq) == start and self.runtime.seq_pos_max(hold_seq) == end - 1:
            snap = self.runtime.snapshot_state(hold_seq)
        if snap is None:
            self.runtime.seq_rm(hold_seq, -1, -1)
            raise ExtractError(f"could not snapshot positions [{start}, {end}) of sequence {src_seq}")
        return PendingExtract(start, end, hold_seq, self.runtime.read_snapshot(snap, hold_seq))

    def _restore_into(self, blob, target_seq: int, start: int, end: int, t0: float) -> RestoreResult:
        """Split layout: the state, from position 0, straight into the target's own stream (llama.cpp empties
        the target first)."""
        if start != 0:
            raise RestoreError(f"the split KV layout restores from position 0, not {start} (the router restores "
                               "whole prefixes there)")
        try:
            if not self.runtime.state_seq_set(blob, target_seq):
                raise RestoreError("llama.cpp refused the restored state (no room in the KV stream?)")
            if self.runtime.seq_pos_max(target_seq) != end - 1:
                raise RestoreError("restored state does not end where the segments do")
        except StreamCopyPending as exc:
            raise RestoreError(str(exc)) from exc
        except RestoreError:
            self.runtime.seq_rm(target_seq, -1, -1)
            raise
        return RestoreResult(end - start, len(blob), (time.perf_counter() - t0) * 1000.0)


def used_cells(runtime: LlamaRuntime) -> int:
    """Cells of the KV owned by at least one sequence (every stream's, split; read from a full state dump,
    so it is exact but costs a copy of the KV: for /cache/stats checks, tests and
    benchmarks, never on the request path). Engine thread."""
    return count_state_cells(runtime.state_seq_get(-1))
