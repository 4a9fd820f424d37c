"""The identity a stored KV segment is valid for: the model file, the architecture and the
KV layout. A disk segment written under another fingerprint is never loaded."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

_EDGE = 1 << 20  # hash the first and last MiB: cheap, and changes with any re-quantisation


def file_identity(path: Path) -> str:
    size = path.stat().st_size
    h = hashlib.sha256(str(size).encode())
    with open(path, "rb") as f:
        h.update(f.read(_EDGE))
        if size > _EDGE:
            f.seek(max(_EDGE, size - _EDGE))
            h.update(f.read(_EDGE))
    return h.hexdigest()


def model_fingerprint(model_path: Path, *, architecture: str, n_layer: int, n_embd: int, kv_types: str) -> str:
    doc = {"file": file_identity(model_path), "arch": architecture, "n_layer": n_layer, "n_embd": n_embd,
           "kv": kv_types}
    return hashlib.sha256(json.dumps(doc, sort_keys=True).encode()).hexdigest()[:32]
