"""State checkpoints on disk, beside tier D's segment files: what lets D restore a sliding-window
or hybrid model's prefix after a restart (server/cache/checkpoint_store.py keeps them in RAM).

One file per checkpoint, `<cache dir>/checkpoints/<prefix digest>.ckpt`: a header line of JSON
(`magic`, the model fingerprint D's files carry, `pos`, the blob's length and SHA-256), then the
blob (llama.cpp's PARTIAL_ONLY sequence state). Written to a temporary name and renamed, so a
crash leaves either the whole file or none.

Contracts: `write(digest, ckpt)` stores it (the oldest files beyond `budget_bytes` are deleted);
`index()` lists what a previous run left, by digest, without reading the blobs; `read(digest)`
returns the checkpoint, or None when the file is gone, of another model (fingerprint) or
damaged (then deleted). I/O errors are logged and counted, never raised: a missing checkpoint
costs compute, never a request.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
from pathlib import Path

from server.cache.checkpoints import StateCheckpoint

log = logging.getLogger(__name__)

MAGIC = "arbor-checkpoint-1"
SUFFIX = ".ckpt"


class CheckpointFiles:
    def __init__(self, directory: Path, fingerprint: str, budget_bytes: int):
        self.dir = directory
        self.dir.mkdir(parents=True, exist_ok=True)
        self.fingerprint, self.budget_bytes = fingerprint, budget_bytes
        self._sizes: dict[bytes, int] = {}  # digest -> file size, oldest first (insertion order)
        self.errors = self.dropped = 0
        for digest, _pos, _mtime, size in sorted(self._scan(), key=lambda e: e[2]):  # oldest first
            self._sizes[digest] = size

    def _path(self, digest: bytes) -> Path:
        return self.dir / f"{digest.hex()}{SUFFIX}"

    def _scan(self) -> list[tuple[bytes, int, int, int]]:
        """(digest, position, mtime, size) of this model's checkpoint files."""
        out = []
        for path in self.dir.glob(f"*{SUFFIX}"):
            try:
                with path.open("rb") as f:
                    head = json.loads(f.readline())
                if head.get("magic") != MAGIC or head.get("fingerprint") != self.fingerprint:
                    continue  # another model's (or format's): left for it
                st = path.stat()
                out.append((bytes.fromhex(path.stem), int(head["pos"]), st.st_mtime_ns, st.st_size))
            except (OSError, ValueError, KeyError) as exc:
                log.warning("checkpoint file %s unreadable (%s): ignored", path.name, exc)
        return out

    def index(self) -> list[tuple[bytes, int]]:
        """(digest, position) of every checkpoint of this model on disk."""
        return [(d, p) for d, p, _, _ in self._scan()]

    def write(self, digest: bytes, ckpt: StateCheckpoint) -> None:
        head = json.dumps({"magic": MAGIC, "fingerprint": self.fingerprint, "pos": ckpt.pos, "bytes": ckpt.nbytes,
                           "sha256": hashlib.sha256(ckpt.blob).hexdigest()}).encode() + b"\n"
        size = len(head) + ckpt.nbytes
        if size > self.budget_bytes:
            return
        path = self._path(digest)
        tmp = path.with_suffix(".tmp")
        try:
            with tmp.open("wb") as f:
                f.write(head)
                f.write(ckpt.blob)
            os.replace(tmp, path)
        except OSError as exc:
            self.errors += 1
            log.warning("checkpoint file %s not written: %s", path.name, exc)
            tmp.unlink(missing_ok=True)
            return
        self._sizes.pop(digest, None)
        self._sizes[digest] = size
        while sum(self._sizes.values()) > self.budget_bytes and len(self._sizes) > 1:
            self._drop(next(iter(self._sizes)))

    def read(self, digest: bytes) -> StateCheckpoint | None:
        path = self._path(digest)
        try:
            data = path.read_bytes()
        except FileNotFoundError:
            self._sizes.pop(digest, None)
            return None
        except OSError as exc:
            self.errors += 1
            log.warning("checkpoint file %s not read: %s", path.name, exc)
            return None
        try:
            cut = data.index(b"\n")
            head, blob = json.loads(data[:cut]), data[cut + 1:]
            ok = (head.get("magic") == MAGIC and head.get("fingerprint") == self.fingerprint
                  and len(blob) == head["bytes"] and hashlib.sha256(blob).hexdigest() == head["sha256"])
        except (ValueError, KeyError):
            ok = False
        if not ok:
            log.warning("checkpoint file %s is damaged or not this model's: deleted", path.name)
            self._drop(digest)
            return None
        return StateCheckpoint(int(head["pos"]), blob)

    def _drop(self, digest: bytes) -> None:
        self._sizes.pop(digest, None)
        self._path(digest).unlink(missing_ok=True)
        self.dropped += 1

    def stats(self) -> dict:
        return {"files": len(self._sizes), "bytes": sum(self._sizes.values()), "budget_bytes": self.budget_bytes,
                "errors": self.errors, "dropped": self.dropped}
