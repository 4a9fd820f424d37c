"""The `.kvseg` segment format: the KV of one token range of one radix path, self-describing
and checksummed. The disk tier (server/cache/disk_tier.py) keeps one file per range; the
shared tier (server/cache/shared_tier.py) stores the same bytes, behind a MAC, as a value.

    "ARBORKV3" | u32 header length | header (JSON) | SHA-256 of the header (32 bytes) | body

The header holds the model fingerprint, the full token path up to the range's end, where
the range starts, its KV layout and the SHA-256 of the body; the body is the raw K/V
arrays in llama.cpp's own layout (written from the segment's views, read back into one
buffer and viewed, never copied byte by byte). The header has its own checksum because it
says *where* the KV belongs: a flipped token id would put valid KV on the wrong radix path.

Contracts:
- `encode_segment` makes the bytes (size known without I/O); `write_segment_file` writes
  them atomically (temp file, fsync, rename, directory fsync; a failed write deletes its
  temp file before the error propagates), so a `.kvseg` name always means a complete write.
- `read_header` / `parse_segment` check the magic, the header length and checksum;
  `check_header` checks the fingerprint, the header's consistency and the size it promises
  (a truncated body is caught without reading it). `read_segment_file` and `read_ranges`
  also check the body's checksum.
- Errors: ForeignSegmentFile (another model, KV layout or format version: sound, never
  loaded), CorruptSegmentFile (torn, truncated, garbage, a checksum mismatch), both
  DiskSegmentError, whose message starts with the file's (or value's) name.
"""

from __future__ import annotations

import hashlib
import json
import os
import struct
import uuid
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from server.cache.kv_format import EmptyStateBlob, KVLayout, KVSegment, segment_from_arrays

MAGIC = b"ARBORKV3"
FAMILY = b"ARBORKV"  # any version of the format: an older one is foreign, not corrupt
VERSION = 3
SUFFIX = ".kvseg"
DIGEST_BYTES = 32  # SHA-256 bytes after the header
MAX_HEADER = 64 << 20  # a longer header length is garbage (a path of 8M tokens is far beyond any context)


class DiskSegmentError(RuntimeError):
    """A segment file is missing, corrupt or of another model."""


class CorruptSegmentFile(DiskSegmentError):
    """Torn, truncated, garbage, or a checksum does not match: never loaded, counted."""


class ForeignSegmentFile(DiskSegmentError):
    """A sound file of another model, KV layout or format version: never loaded, counted."""


@dataclass(eq=False)
class SegmentFile:
    """One file on disk: the KV of positions [start, start + n); `refs` nodes use it."""

    path: Path
    start: int
    n: int
    size: int
    header_sha256: str = ""  # the header indexed: a read of another file under this name fails
    refs: int = 0

    @property
    def nbytes(self) -> int:
        """What the file holds on disk while any node uses a range of it (the D budget's unit)."""
        return self.size


def _layout_to_json(layout: KVLayout) -> dict:
    return {k: (list(v) if isinstance(v, tuple) else v) for k, v in layout.__dict__.items()}


def layout_from_json(d: dict) -> KVLayout:
    return KVLayout(bool(d["v_trans"]), *(tuple(d[k]) for k in ("k_types", "k_row_bytes", "v_types",
                                                                   "v_row_bytes", "v_el_bytes")))


@dataclass(frozen=True)
class EncodedSegment:
    """A segment file's bytes before it is written: its size is known without any I/O."""

    head: bytes  # magic, header length, header, header checksum
    arrays: list[np.ndarray]
    start: int
    n: int
    header_sha256: str

    @property
    def size(self) -> int:
        return len(self.head) + sum(a.nbytes for a in self.arrays)


def encode_segment(fingerprint: str, path_tokens: list[int], seg: KVSegment) -> EncodedSegment:
    """The file for `seg` (the KV of path_tokens[seg.pos0:]): the arrays are kept as they
    are (a transposed-V slice is made contiguous) and checksummed, not copied."""
    arrays = [np.ascontiguousarray(a) for a in seg.arrays()]
    digest = hashlib.sha256()
    for a in arrays:
        digest.update(a.data)
    header = json.dumps({
        "version": VERSION, "fingerprint": fingerprint, "tokens": list(path_tokens), "start": seg.pos0,
        "n": seg.n_tokens, "layout": _layout_to_json(seg.layout), "sha256": digest.hexdigest(),
    }).encode()
    header_digest = hashlib.sha256(header).digest()
    head = MAGIC + struct.pack("<I", len(header)) + header + header_digest
    return EncodedSegment(head, arrays, seg.pos0, seg.n_tokens, header_digest.hex())


def write_segment_file(directory: Path, encoded: EncodedSegment) -> SegmentFile:
    """Write a file atomically: to a temp file, fsynced, renamed, then the directory fsynced
    (the rename is durable). The arrays go to the file from their own memory. On any error
    (ENOSPC included) the temp file is deleted before the error propagates."""
    final = directory / f"{uuid.uuid4().hex}{SUFFIX}"
    tmp = final.with_suffix(".tmp")
    try:
        with open(tmp, "wb") as f:
            f.write(encoded.head)
            for a in encoded.arrays:
                f.write(a.data)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, final)
    except BaseException:
        tmp.unlink(missing_ok=True)  # a failed write leaves nothing behind (not even until the next start)
        raise
    fsync_directory(directory)
    return SegmentFile(final, encoded.start, encoded.n, final.stat().st_size, encoded.header_sha256)


def fsync_directory(directory: Path) -> None:
    """Make the directory's entries (a rename, an unlink) durable: without it a power loss
    after the rename may lose the new name although the file's data were synced."""
    fd = os.open(directory, os.O_RDONLY | getattr(os, "O_DIRECTORY", 0))
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def read_header(path: Path) -> tuple[dict, int, str]:
    """The checked header of a segment file, the offset of its body and the header's SHA-256.
    Raises ForeignSegmentFile for another format version, CorruptSegmentFile for anything
    that is not a whole, checksummed header (OSError when the file cannot be read)."""
    with open(path, "rb") as f:
        head = f.read(len(MAGIC) + 4)
        hlen = _header_length(path.name, head)
        raw = f.read(hlen)
        digest = f.read(DIGEST_BYTES)
    return _parse_header(path.name, raw, digest, hlen), len(MAGIC) + 4 + hlen + DIGEST_BYTES, digest.hex()


def parse_segment(data: bytes | memoryview, name: str) -> tuple[dict, int]:
    """The checked header of a segment held in memory (a shared-store value) and the offset
    of its body; the errors of `read_header`, their messages starting with `name`."""
    view = memoryview(data)
    hlen = _header_length(name, bytes(view[:len(MAGIC) + 4]))
    head = len(MAGIC) + 4
    raw, digest = bytes(view[head:head + hlen]), bytes(view[head + hlen:head + hlen + DIGEST_BYTES])
    return _parse_header(name, raw, digest, hlen), head + hlen + DIGEST_BYTES


def _header_length(name: str, head: bytes) -> int:
    if head[: len(FAMILY)] == FAMILY and len(head) >= len(MAGIC) and head[: len(MAGIC)] != MAGIC:
        raise ForeignSegmentFile(f"{name}: written by another version of the segment format")
    if len(head) < len(MAGIC) + 4 or head[: len(MAGIC)] != MAGIC:
        raise CorruptSegmentFile(f"{name}: not a whole Arbor KV segment file (torn or garbage)")
    (hlen,) = struct.unpack("<I", head[len(MAGIC):])
    if hlen > MAX_HEADER:
        raise CorruptSegmentFile(f"{name}: implausible header length {hlen}")
    return hlen


def _parse_header(name: str, raw: bytes, digest: bytes, hlen: int) -> dict:
    if len(raw) != hlen or len(digest) != DIGEST_BYTES:
        raise CorruptSegmentFile(f"{name}: the file ends inside its header (torn write)")
    if hashlib.sha256(raw).digest() != digest:
        raise CorruptSegmentFile(f"{name}: header checksum mismatch (corrupt file)")
    try:
        header = json.loads(raw)
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise CorruptSegmentFile(f"{name}: unreadable header") from exc
    if not isinstance(header, dict):
        raise CorruptSegmentFile(f"{name}: unreadable header")
    return header


def check_header(name: str, header: dict, fingerprint: str, size: int, offset: int) -> tuple[list[int], KVLayout]:
    """The header's token path and layout, if the file is of this model and whole (its size
    is what the header promises: a truncated body is caught without reading it)."""
    if header.get("fingerprint") != fingerprint:
        raise ForeignSegmentFile(f"{name}: written for another model or KV layout")
    try:
        start, n, tokens = header["start"], header["n"], header["tokens"]
        layout = layout_from_json(header["layout"])
        ok = (isinstance(tokens, list) and all(type(t) is int for t in tokens) and type(start) is int
              and type(n) is int and 0 <= start and 0 < n and start + n == len(tokens))
        expected = offset + n * int(layout.bytes_per_token)
    except (KeyError, TypeError, ValueError) as exc:
        raise CorruptSegmentFile(f"{name}: inconsistent header ({type(exc).__name__}: {exc})") from exc
    if not ok:
        raise CorruptSegmentFile(f"{name}: inconsistent header")
    if size != expected:
        raise CorruptSegmentFile(f"{name}: {size} bytes where the header promises {expected} (truncated or torn)")
    return tokens, layout


def read_segment_file(path: Path, fingerprint: str, header_sha256: str | None = None) -> KVSegment:
    """The whole file's segment, checked (header, size, body checksum, and when given, that
    the header is the one indexed): one read into one buffer, arrays are views."""
    try:
        header, offset, digest = read_header(path)
        with open(path, "rb") as f:
            size = os.fstat(f.fileno()).st_size
            f.seek(offset)
            body = bytearray(max(size - offset, 0))
            got = f.readinto(body)
    except OSError as exc:
        raise DiskSegmentError(f"{path.name}: {exc}") from exc
    if header_sha256 is not None and digest != header_sha256:
        raise CorruptSegmentFile(f"{path.name}: not the file that was indexed under this name")
    _, layout = check_header(path.name, header, fingerprint, size, offset)
    if got != len(body) or hashlib.sha256(body).hexdigest() != header.get("sha256"):
        raise CorruptSegmentFile(f"{path.name}: body checksum mismatch (corrupt file)")
    return segment_from_arrays(layout, header["start"], header["n"], body)


def read_ranges(ranges: list[tuple[SegmentFile, int, int]], fingerprint: str, streams: int = 1) -> KVSegment:
    """The KV of consecutive path ranges, each (file, start, end) in path positions, as one
    sequence state ready for llama.cpp (a context of `streams` KV streams). Each file is read
    once and checked (the header it was indexed under, its size, the body checksum). A range
    that is a whole file goes from the file straight into the state's rows (one copy; V not
    transposed); a part of a file is read whole (to check it), then its rows are copied."""
    blob: EmptyStateBlob | None = None
    first, total = ranges[0][1], sum(e - s for _, s, e in ranges)
    for file, a, b in ranges:
        path = file.path
        try:
            header, offset, header_digest = read_header(path)
            if file.header_sha256 and header_digest != file.header_sha256:
                raise CorruptSegmentFile(f"{path.name}: not the file that was indexed under this name")
            with open(path, "rb") as f:
                size = os.fstat(f.fileno()).st_size
                _, layout = check_header(path.name, header, fingerprint, size, offset)
                if (header["start"], header["n"]) != (file.start, file.n):
                    raise CorruptSegmentFile(f"{path.name}: holds other positions than indexed")
                if blob is None:
                    blob = EmptyStateBlob(layout, first, total, streams)
                elif layout != blob.layout:
                    raise CorruptSegmentFile(f"{path.name}: another KV layout than the files before it")
                f.seek(offset)
                digest = hashlib.sha256()
                if (a, b) == (file.start, file.start + file.n) and not layout.v_trans:
                    for li in range(2 * layout.n_layer):
                        dst = blob.rows(li, a - first, b - first).data.cast("B")
                        if f.readinto(dst) != dst.nbytes:
                            raise CorruptSegmentFile(f"{path.name}: the body ends early (truncated)")
                        digest.update(dst)
                else:
                    body = bytearray(size - offset)
                    if f.readinto(body) != len(body):
                        raise CorruptSegmentFile(f"{path.name}: the body ends early (truncated)")
                    digest.update(body)
                    part = segment_from_arrays(layout, file.start, file.n, body).slice(a - file.start, b - file.start)
                    for li, src in enumerate(part.arrays()):
                        blob.rows(li, a - first, b - first)[...] = src
        except OSError as exc:
            raise DiskSegmentError(f"{path.name}: {exc}") from exc
        if digest.hexdigest() != header.get("sha256"):
            raise CorruptSegmentFile(f"{path.name}: body checksum mismatch (corrupt file)")
    assert blob is not None
    return blob.segment()
