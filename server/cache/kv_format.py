"""Direct KV: llama.cpp's per-sequence state, parsed into token-range segments.

`llama_state_seq_get_data_ext(seq)` writes (unified KV, one stream):

    u32 magic (0xaf143cd8) | i32 seq_id | u32 n_stream (=1) | u32 cell_count
    cell_count x { i32 pos, u32 n_seq_id (=1), i32 seq_id }          # cell order, not position order
    u32 v_trans | u32 n_layer
    n_layer x { i32 k_type, u64 k_row_bytes, cell_count rows }         # K: one row per cell
    if not v_trans: n_layer x { i32 v_type, u64 v_row_bytes, cell_count rows }
    else:           n_layer x { i32 v_type, u32 v_el_bytes, u32 n_embd_v, n_embd_v x cell_count elements }

A `KVSegment` holds the K and V of consecutive positions [pos0, pos0 + n), one row per
token per layer (transposed V is turned back into rows), so segments split and join by
slicing and concatenating, and a run of segments becomes one blob that
`llama_state_seq_set_data_ext` restores with the original positions. A segment's KV is
only valid after exactly the tokens of its radix path; the tree guarantees that, not us.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass

import numpy as np

SEQ_STATE_MAGIC = 0xAF143CD8  # llama-context.cpp's io_magic for sequence states

class KVFormatError(ValueError):
    """The blob is not a single-stream sequence state of a layout we understand."""


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


@dataclass
class KVSegment:
    layout: KVLayout
    pos0: int
    k: list[np.ndarray]  # per layer: (n, k_row_bytes) uint8
    v: list[np.ndarray]  # per layer: (n, v_row_bytes) uint8

    @property
    def n_tokens(self) -> int:
        return int(self.k[0].shape[0]) if self.k else 0

    @property
    def nbytes(self) -> int:
        return sum(a.nbytes for a in self.k) + sum(a.nbytes for a in self.v)

    def split(self, offset: int) -> tuple[KVSegment, KVSegment]:
        if not 0 < offset < self.n_tokens:
            raise ValueError(f"split offset {offset} outside (0, {self.n_tokens})")
        left = KVSegment(self.layout, self.pos0, [a[:offset] for a in self.k], [a[:offset] for a in self.v])
        right = KVSegment(self.layout, self.pos0 + offset, [a[offset:] for a in self.k], [a[offset:] for a in self.v])
        return left, right

    def slice(self, start: int, end: int) -> KVSegment:
        """Tokens [start, end) of this segment (offsets relative to pos0)."""
        return KVSegment(self.layout, self.pos0 + start, [a[start:end] for a in self.k], [a[start:end] for a in self.v])

    def compact(self) -> KVSegment:
        """Own copies of the rows, so a slice does not keep a larger parent buffer alive."""
        return KVSegment(self.layout, self.pos0, [np.ascontiguousarray(a).copy() for a in self.k],
                         [np.ascontiguousarray(a).copy() for a in self.v])

    @staticmethod
    def join(segments: list[KVSegment]) -> KVSegment:
        if not segments:
            raise ValueError("nothing to join")
        first = segments[0]
        pos = first.pos0
        for s in segments:
            if s.layout != first.layout:
                raise KVFormatError("segments of different KV layouts cannot be joined")
            if s.pos0 != pos:
                raise KVFormatError(f"segments are not consecutive: expected pos {pos}, got {s.pos0}")
            pos += s.n_tokens
        if len(segments) == 1:
            return first
        return KVSegment(
            first.layout, first.pos0,
            [np.concatenate([s.k[i] for s in segments]) for i in range(first.layout.n_layer)],
            [np.concatenate([s.v[i] for s in segments]) for i in range(first.layout.n_layer)],
        )

    def to_state_blob(self) -> bytes:
        """A sequence state that restores exactly these tokens at their positions."""
        n, lay = self.n_tokens, self.layout
        parts: list[bytes] = [struct.pack("<IiII", SEQ_STATE_MAGIC, 0, 1, n)]
        meta = np.zeros(n, dtype=[("pos", "<i4"), ("n_seq", "<u4"), ("seq", "<i4")])
        meta["pos"] = np.arange(self.pos0, self.pos0 + n, dtype=np.int32)
        meta["n_seq"] = 1
        parts.append(meta.tobytes())
        parts.append(struct.pack("<II", int(lay.v_trans), lay.n_layer))
        for i in range(lay.n_layer):
            parts.append(struct.pack("<iQ", lay.k_types[i], lay.k_row_bytes[i]))
            parts.append(np.ascontiguousarray(self.k[i]).tobytes())
        for i in range(lay.n_layer):
            if not lay.v_trans:
                parts.append(struct.pack("<iQ", lay.v_types[i], lay.v_row_bytes[i]))
                parts.append(np.ascontiguousarray(self.v[i]).tobytes())
            else:
                el = lay.v_el_bytes[i]
                n_embd_v = lay.v_row_bytes[i] // el
                parts.append(struct.pack("<iII", lay.v_types[i], el, n_embd_v))
                cols = self.v[i].reshape(n, n_embd_v, el).transpose(1, 0, 2)
                parts.append(np.ascontiguousarray(cols).tobytes())
        return b"".join(parts)


def parse_seq_state(blob: bytes) -> KVSegment:
    """Parse one sequence's state into a segment ordered by position.

    Raises KVFormatError unless the state holds consecutive positions of one sequence in
    one stream and the whole blob is consumed (anything else is a layout we do not know).
    """
    r = _Reader(blob)
    magic, _seq = r.take("<Ii")
    if magic != SEQ_STATE_MAGIC:
        raise KVFormatError(f"not a llama.cpp sequence state (magic {magic:#x})")
    (n_stream,) = r.take("<I")
    if n_stream != 1:
        raise KVFormatError(f"{n_stream} KV streams: Direct KV needs a unified KV cache")
    (n,) = r.take("<I")
    if n == 0:
        raise KVFormatError("the sequence holds no cells")
    meta = np.frombuffer(r.array(n * 12).tobytes(), dtype=[("pos", "<i4"), ("n_seq", "<u4"), ("seq", "<i4")])
    if np.any(meta["n_seq"] != 1):
        raise KVFormatError("cells with several sequence ids: not a single-sequence state")
    order = np.argsort(meta["pos"], kind="stable")
    pos = meta["pos"][order]
    if np.any(np.diff(pos) != 1):
        raise KVFormatError("the sequence's positions are not consecutive")
    v_trans, n_layer = r.take("<II")
    k_types, k_rows, ks = [], [], []
    for _ in range(n_layer):
        t, row = r.take("<iQ")
        k_types.append(t)
        k_rows.append(row)
        ks.append(r.array(n * row).reshape(n, row)[order])
    v_types, v_rows, v_els, vs = [], [], [], []
    for _ in range(n_layer):
        if not v_trans:
            t, row = r.take("<iQ")
            v_types.append(t)
            v_rows.append(row)
            v_els.append(0)
            vs.append(r.array(n * row).reshape(n, row)[order])
        else:
            t, el, n_embd_v = r.take("<iII")
            v_types.append(t)
            v_rows.append(el * n_embd_v)
            v_els.append(el)
            cols = r.array(n * el * n_embd_v).reshape(n_embd_v, n, el)
            vs.append(cols.transpose(1, 0, 2).reshape(n, n_embd_v * el)[order])
    if r.off != len(r.buf):
        raise KVFormatError(f"{len(r.buf) - r.off} unexpected trailing bytes (cell extensions are not supported)")
    layout = KVLayout(bool(v_trans), tuple(k_types), tuple(k_rows), tuple(v_types), tuple(v_rows), tuple(v_els))
    return KVSegment(layout, int(pos[0]), ks, vs)


def count_state_cells(blob: bytes) -> int:
    """Cells in a whole-context state dump (seq_id -1) of a unified (single-stream) KV."""
    magic, _seq, n_stream, n = struct.unpack_from("<IiII", blob, 0)
    if magic != SEQ_STATE_MAGIC:
        raise KVFormatError("not a llama.cpp sequence state")
    if n_stream != 1:
        raise KVFormatError("count_state_cells expects a unified KV (one stream)")
    return int(n)
