"""Direct KV: llama.cpp's per-sequence state, parsed into token-range segments.

`llama_state_seq_get_data_ext(seq)` writes (unified KV: one stream):

    u32 magic (0xaf143cd8) | i32 seq_id | u32 n_stream (=1) | u32 cell_count
    cell_count x { i32 pos, u32 n_seq_id (=1), i32 seq_id }          # cell order, not position order
    u32 v_trans | u32 n_layer
    n_layer x { i32 k_type, u64 k_row_bytes, cell_count rows }         # K: one row per cell
    if not v_trans: n_layer x { i32 v_type, u64 v_row_bytes, cell_count rows }
    else:           n_layer x { i32 v_type, u32 v_el_bytes, u32 n_embd_v, n_embd_v x cell_count elements }

In the split layout (`--kv-layout split`: a KV stream per sequence, server/engine/kv_layout.py)
`n_stream` is the context's stream count and every stream has its `cell_count`; a sequence's
cells are in its own stream, the others count 0 and carry nothing (`u32 0`). llama.cpp restores
such a state into the destination sequence's stream whichever stream held it, but only into a
context of the same stream count, so a state is written for the context it goes to
(`state_blob(..., streams=n)`); the segments themselves are layout-free, which is why host,
disk and shared-store KV written under one layout restores under the other.

Rows are bytes: a quantized K or V row (q8_0, q4_0, ... from `--cache-type-k/-v`) is whole
blocks of one token's `n_embd` elements, so it splits and joins by token like an f16 row. A
transposed V of a quantized type would not (a block spans cells); llama.cpp never writes one
(a quantized V needs flash attention, which keeps V untransposed), and the parser refuses it.

A `KVSegment` holds the K and V of consecutive positions [pos0, pos0 + n) as numpy views
in that same layout (transposed V stays transposed), so parsing, splitting and slicing copy
nothing; cells are reordered only when llama.cpp wrote them out of position order. A run
of segments becomes one blob for `llama_state_seq_set_data_ext` with a single copy per
layer (`state_blob`), and a segment that is still its whole parsed blob is restored from
that buffer as it is. A segment's KV is only valid after exactly the tokens of its radix
path; the tree guarantees that, not us.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass

import numpy as np

from server.engine.kv_types import QUANTIZED_TYPE_IDS

SEQ_STATE_MAGIC = 0xAF143CD8  # llama-context.cpp's io_magic for sequence states

class KVFormatError(ValueError):
    """The blob is not a one-sequence state of a layout we understand."""


@dataclass(frozen=True)
class KVLayout:
    """Per-layer row formats; two segments can be joined only if their layouts are equal."""

    v_trans: bool
    k_types: tuple[int, ...]
    k_row_bytes: tuple[int, ...]
    v_types: tuple[int, ...]
    v_row_bytes: tuple[int, ...]  # per token: n_embd_v * v_el_bytes when transposed
    v_el_bytes: tuple[int, ...]  # 0 when not transposed

    @property
    def n_layer(self) -> int:
        return len(self.k_types)

    @property
    def bytes_per_token(self) -> int:
        return sum(self.k_row_bytes) + sum(self.v_row_bytes)


class _Reader:
    def __init__(self, data: bytes | memoryview):
        self.buf = memoryview(data)
        self.off = 0

    def take(self, fmt: str):
        size = struct.calcsize(fmt)
        if self.off + size > len(self.buf):
            raise KVFormatError("state blob ends early")
        vals = struct.unpack_from(fmt, self.buf, self.off)
        self.off += size
        return vals

    def array(self, n_bytes: int) -> np.ndarray:
        if self.off + n_bytes > len(self.buf):
            raise KVFormatError("state blob ends early")
        out = np.frombuffer(self.buf, dtype=np.uint8, count=n_bytes, offset=self.off)
        self.off += n_bytes
        return out


def _token_axis(layout: KVLayout, is_v: bool) -> int:
    """K rows and untransposed V rows are token-major; transposed V is (n_embd_v, n, el)."""
    return 1 if is_v and layout.v_trans else 0


def _take(a: np.ndarray, axis: int, start: int, end: int) -> np.ndarray:
    return a[start:end] if axis == 0 else a[:, start:end]


class MemoryBlock:
    """One allocation that segments view: it lives while any of them does, so a budget
    charges it once, whole, however many segments (or how small a slice of it) still use it."""

    __slots__ = ("nbytes",)

    def __init__(self, nbytes: int):
        self.nbytes = int(nbytes)

    def __repr__(self) -> str:
        return f"MemoryBlock({self.nbytes})"


@dataclass
class KVSegment:
    """K and V of positions [pos0, pos0 + n) as numpy views, in llama.cpp's own row layout.

    `k[i]` is (n, k_row_bytes); `v[i]` is (n, v_row_bytes), or (n_embd_v, n, v_el_bytes)
    when V is transposed. Splitting and slicing make views (no copy). `blob`, when set, is
    the sequence state the views were parsed from, whole and in position order, so a
    restore can hand it to llama.cpp as it is. `memory` is the allocation the views keep
    alive (a slice keeps its parent's); a segment made from its own arrays owns them.
    """

    layout: KVLayout
    pos0: int
    k: list[np.ndarray]
    v: list[np.ndarray]
    blob: memoryview | None = None
    memory: MemoryBlock | None = None
    blob_streams: int = 1  # the KV stream count of the context `blob` was written for

    def __post_init__(self) -> None:
        if self.memory is None:
            self.memory = MemoryBlock(self.nbytes)

    @property
    def n_tokens(self) -> int:
        return int(self.k[0].shape[0]) if self.k else 0

    @property
    def nbytes(self) -> int:
        return sum(a.nbytes for a in self.k) + sum(a.nbytes for a in self.v)

    def split(self, offset: int) -> tuple[KVSegment, KVSegment]:
        if not 0 < offset < self.n_tokens:
            raise ValueError(f"split offset {offset} outside (0, {self.n_tokens})")
        return self.slice(0, offset), self.slice(offset, self.n_tokens)

    def slice(self, start: int, end: int) -> KVSegment:
        """Tokens [start, end) of this segment (offsets relative to pos0), as views."""
        va = _token_axis(self.layout, True)
        return KVSegment(self.layout, self.pos0 + start, [a[start:end] for a in self.k],
                         [_take(a, va, start, end) for a in self.v], memory=self.memory)

    def compact(self) -> KVSegment:
        """The same KV in an allocation of its own (one copy per array): a small slice that
        should not keep a large buffer alive."""
        return KVSegment(self.layout, self.pos0, [np.array(a) for a in self.k], [np.array(a) for a in self.v])

    @staticmethod
    def join(segments: list[KVSegment]) -> KVSegment:
        """One segment over consecutive ones: a single copy into a fresh state blob."""
        if len(segments) == 1:
            return segments[0]
        return parse_seq_state(state_blob(segments))

    def to_state_blob(self, streams: int = 1) -> memoryview:
        """A sequence state that restores exactly these tokens at their positions, into a context
        of `streams` KV streams (1: unified)."""
        if self.blob is not None and self.blob_streams == streams:
            return self.blob
        return state_blob([self], streams)

    def arrays(self) -> list[np.ndarray]:
        """Every per-layer array, K layers then V layers (the order of the state blob)."""
        return self.k + self.v


def cut(ranges: list[tuple[int, KVSegment]], start: int, end: int) -> list[KVSegment] | None:
    """The KV of path positions [start, end) as parts of `ranges`, (path position, segment)
    pairs in path order (`positioned` makes them from consecutive segments): each part a
    whole segment or a slice of one (a view, no copy); None when the ranges leave a gap in
    [start, end). The one range cutter of the cache (host restores, disk and shared writes)."""
    parts: list[KVSegment] = []
    pos = start
    for s, seg in ranges:
        if pos >= end:
            break
        e = s + seg.n_tokens
        if e <= pos or s >= end:
            continue
        if s > pos:
            return None
        stop = min(end, e)
        parts.append(seg if (pos, stop) == (s, e) else seg.slice(pos - s, stop - s))
        pos = stop
    return parts if pos >= end else None


def positioned(segments: list[KVSegment], pos: int = 0) -> list[tuple[int, KVSegment]]:
    """Consecutive segments (the first at path position `pos`) as (position, segment) pairs."""
    out = []
    for seg in segments:
        out.append((pos, seg))
        pos += seg.n_tokens
    return out


def state_blob(segments: list[KVSegment], streams: int = 1, take=None) -> memoryview:
    """Consecutive segments written into one new sequence state for a context of `streams` KV
    streams: one allocation (`take(nbytes)` gives it when set: a kept buffer, server/cache/staging_buffers.py) and
    one memcpy-class copy per layer and segment. Raises KVFormatError if they do not fit."""
    if not segments:
        raise KVFormatError("nothing to join")
    lay, pos0 = segments[0].layout, segments[0].pos0
    pos = pos0
    for s in segments:
        if s.layout != lay:
            raise KVFormatError("segments of different KV layouts cannot be joined")
        if s.pos0 != pos:
            raise KVFormatError(f"segments are not consecutive: expected pos {pos}, got {s.pos0}")
        pos += s.n_tokens
    blob = EmptyStateBlob(lay, pos0, pos - pos0, streams, take=take)
    t = 0
    for s in segments:
        for li, src in enumerate(s.arrays()):
            dst = blob.rows(li, t, t + s.n_tokens)
            if src.shape != dst.shape:
                raise KVFormatError(f"a segment's layer {li % lay.n_layer} rows do not match its layout")
            dst[...] = src
        t += s.n_tokens
    return blob.buf


class EmptyStateBlob:
    """A sequence state for positions [pos0, pos0 + n) whose headers are written and whose
    K/V rows are left for the caller to fill (`rows`), e.g. straight from a file: the KV
    then reaches llama.cpp's format with a single copy. Every row must be written. `streams`:
    the KV stream count of the context it is for (the cells go in the first stream, the
    others count 0). `take(nbytes)`: where its buffer comes from (default: a new one)."""

    def __init__(self, layout: KVLayout, pos0: int, n: int, streams: int = 1, take=None):
        if streams < 1:
            raise KVFormatError(f"{streams} KV streams")
        self.layout, self.pos0, self.n, self.streams = layout, pos0, n, streams
        header = 16 + 12 * n + 8
        body = sum(12 + n * r for r in list(layout.k_row_bytes) + list(layout.v_row_bytes))
        total = header + body + 4 * (streams - 1)
        buf = np.empty(total, dtype=np.uint8) if take is None else take(total)
        raw = buf.data  # its bytes, for struct and memoryview (numpy types a buffer only on Python 3.12+)
        struct.pack_into("<IiII", raw, 0, SEQ_STATE_MAGIC, 0, streams, n)
        buf[header + body:] = 0  # the other streams' cell counts
        meta = np.frombuffer(buf, dtype=_META, count=n, offset=16)
        meta["pos"] = np.arange(pos0, pos0 + n, dtype=np.int32)
        meta["n_seq"] = 1
        meta["seq"] = 0
        struct.pack_into("<II", raw, 16 + 12 * n, int(layout.v_trans), layout.n_layer)
        self._arrays = []
        off = header
        for li in range(2 * layout.n_layer):
            is_v, i = li >= layout.n_layer, li % layout.n_layer
            if not is_v:
                struct.pack_into("<iQ", raw, off, layout.k_types[i], layout.k_row_bytes[i])
            elif not layout.v_trans:
                struct.pack_into("<iQ", raw, off, layout.v_types[i], layout.v_row_bytes[i])
            else:
                struct.pack_into("<iII", raw, off, layout.v_types[i], layout.v_el_bytes[i],
                                 layout.v_row_bytes[i] // layout.v_el_bytes[i])
            off += 12
            dst = _rows_view(buf, off, n, layout, is_v, i)
            self._arrays.append(dst)
            off += dst.nbytes
        self.buf = raw

    def rows(self, li: int, start: int, end: int) -> np.ndarray:
        """Layer array `li` (K layers, then V layers) for tokens [start, end) of the blob, a
        view (contiguous unless V is transposed)."""
        return _take(self._arrays[li], _token_axis(self.layout, li >= self.layout.n_layer), start, end)

    def segment(self) -> KVSegment:
        """The filled blob as a segment that restores from this buffer as it is."""
        return parse_seq_state(self.buf)


_META = np.dtype([("pos", "<i4"), ("n_seq", "<u4"), ("seq", "<i4")])


def _rows_view(buf, off: int, n: int, lay: KVLayout, is_v: bool, i: int) -> np.ndarray:
    """The array of layer i's K (or V) inside a state blob, as a view."""
    if not is_v:
        row = lay.k_row_bytes[i]
        return np.frombuffer(buf, dtype=np.uint8, count=n * row, offset=off).reshape(n, row)
    row = lay.v_row_bytes[i]
    a = np.frombuffer(buf, dtype=np.uint8, count=n * row, offset=off)
    if not lay.v_trans:
        return a.reshape(n, row)
    el = lay.v_el_bytes[i]
    return a.reshape(row // el, n, el)


def segment_from_arrays(layout: KVLayout, pos0: int, n: int, buf, offset: int = 0) -> KVSegment:
    """Views over `buf` holding a segment's arrays back to back (the disk body format)."""
    arrays = []
    for li in range(2 * layout.n_layer):
        is_v, i = li >= layout.n_layer, li % layout.n_layer
        a = _rows_view(buf, offset, n, layout, is_v, i)
        arrays.append(a)
        offset += a.nbytes
    return KVSegment(layout, pos0, arrays[:layout.n_layer], arrays[layout.n_layer:],
                     memory=MemoryBlock(memoryview(buf).nbytes))


def parse_seq_state(blob, *, more_sections: bool = False) -> KVSegment:
    """Parse one sequence's state into a segment ordered by position, as views over `blob`.

    Cells are reordered (one copy) only when llama.cpp wrote them out of position order.
    Raises KVFormatError unless the state holds consecutive positions of one sequence in
    one stream (of one, unified, or of several, split: the other streams empty) and the whole
    blob is consumed (anything else is a layout we do not know).
    `more_sections`: the state of a model with sliding-window or recurrent layers, whose first
    section is the full-attention KV (iSWA's base cache, a hybrid's attention cache) and whose
    next ones (the window cells, the recurrent state) are left out: the segment is the first
    section alone, copied into a blob of its own (the header and that section; a restore
    appends the rest from a state checkpoint: `with_partial_state`).
    """
    r = _Reader(blob)
    magic, _seq = r.take("<Ii")
    if magic != SEQ_STATE_MAGIC:
        raise KVFormatError(f"not a llama.cpp sequence state (magic {magic:#x})")
    (n_stream,) = r.take("<I")
    if n_stream < 1:
        raise KVFormatError("a state of no KV stream")
    found: tuple | None = None
    for _stream in range(n_stream):
        (n,) = r.take("<I")
        if n == 0:
            continue
        if found is not None:
            raise KVFormatError("cells in several KV streams: not a single-sequence state")
        found = _read_cells(r, n)
    if found is None:
        raise KVFormatError("the sequence holds no cells")
    layout, pos0, ks, vs, order = found
    if r.off != len(r.buf):
        if not more_sections:
            raise KVFormatError(f"{len(r.buf) - r.off} unexpected trailing bytes (cell extensions are not supported)")
        # the first section in a buffer of its own: the views must not keep the window cells or
        # the recurrent state alive (a hybrid's state can be many times its attention KV)
        return parse_seq_state(np.frombuffer(bytes(r.buf[:r.off]), dtype=np.uint8).data)
    if order is not None:
        ks = [a[order] for a in ks]
        vs = [a[:, order] if layout.v_trans else a[order] for a in vs]
        return KVSegment(layout, pos0, ks, vs)
    return KVSegment(layout, pos0, ks, vs, blob=r.buf, memory=MemoryBlock(r.buf.nbytes), blob_streams=n_stream)


def _read_cells(r: _Reader, n: int) -> tuple[KVLayout, int, list[np.ndarray], list[np.ndarray], np.ndarray | None]:
    """One stream's `n` cells of one sequence: its layout, first position, K and V views (cell order) and the
    order that sorts them by position (None when they are in order already)."""
    meta = r.array(n * 12).view(_META)
    if np.any(meta["n_seq"] != 1):
        raise KVFormatError("cells with several sequence ids: not a single-sequence state")
    pos = meta["pos"]
    in_order = bool(np.all(np.diff(pos) == 1))
    order = None
    if not in_order:
        order = np.argsort(pos, kind="stable")
        if np.any(np.diff(pos[order]) != 1):
            raise KVFormatError("the sequence's positions are not consecutive")
    pos0 = int(pos.min())
    v_trans, n_layer = r.take("<II")
    k_types, k_rows, ks = [], [], []
    for _ in range(n_layer):
        t, row = r.take("<iQ")
        k_types.append(t)
        k_rows.append(row)
        ks.append(r.array(n * row).reshape(n, row))
    v_types, v_rows, v_els = [], [], []
    vs: list[np.ndarray] = []
    for _ in range(n_layer):
        if not v_trans:
            t, row = r.take("<iQ")
            v_types.append(t)
            v_rows.append(row)
            v_els.append(0)
            vs.append(r.array(n * row).reshape(n, row))
        else:
            t, el, n_embd_v = r.take("<iII")
            if t in QUANTIZED_TYPE_IDS:
                raise KVFormatError(f"a transposed V of quantized ggml type {t}: its elements are blocks over "
                                    "several cells, not one token's (llama.cpp needs flash attention for it)")
            v_types.append(t)
            v_rows.append(el * n_embd_v)
            v_els.append(el)
            vs.append(r.array(n * el * n_embd_v).reshape(n_embd_v, n, el))
    layout = KVLayout(bool(v_trans), tuple(k_types), tuple(k_rows), tuple(v_types), tuple(v_rows), tuple(v_els))
    return layout, pos0, ks, vs, order


def with_partial_state(full_attention: memoryview | bytes, partial: bytes) -> bytes:
    """A whole sequence state of a model with sliding-window or recurrent layers: the header and
    full-attention section of `full_attention` (a segment's state blob) followed by the sections
    of `partial` (a PARTIAL_ONLY state: its own header, then the window cells or recurrent
    state), the order llama.cpp reads them in."""
    if len(partial) < 8 or struct.unpack_from("<I", partial, 0)[0] != SEQ_STATE_MAGIC:
        raise KVFormatError("the checkpoint is not a llama.cpp sequence state")
    return bytes(full_attention) + bytes(partial[8:])


def count_state_cells(blob) -> int:
    """Cells in a whole-context state dump (seq_id -1): of its one stream (unified), or of every stream (split,
    whose streams each hold one sequence's cells, walked section by section)."""
    magic, _seq, n_stream, n = struct.unpack_from("<IiII", blob, 0)
    if magic != SEQ_STATE_MAGIC:
        raise KVFormatError("not a llama.cpp sequence state")
    if n_stream == 1:
        return int(n)
    r = _Reader(blob)
    r.take("<IiI")
    total = 0
    for _stream in range(n_stream):
        (n,) = r.take("<I")
        if n:
            _skip_cells(r, n)
            total += n
    if r.off != len(r.buf):
        raise KVFormatError(f"{len(r.buf) - r.off} unexpected trailing bytes after {n_stream} KV streams")
    return total


def _skip_cells(r: _Reader, n: int) -> None:
    """Past one stream's `n` cells of a whole-context dump: their ids (any number per cell) and K and V rows."""
    for _ in range(n):
        _pos, n_seq = r.take("<iI")
        r.array(4 * n_seq)
    v_trans, n_layer = r.take("<II")
    for _ in range(n_layer):
        _t, row = r.take("<iQ")
        r.array(n * row)
    for _ in range(n_layer):
        if not v_trans:
            _t, row = r.take("<iQ")
            r.array(n * row)
        else:
            _t, el, n_embd_v = r.take("<iII")
            r.array(n * el * n_embd_v)
