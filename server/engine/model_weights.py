"""The matrix weights of a GGUF file and their ggml types, read with ggml's own GGUF parser.

Which of a model's matrix multiplications an accelerator can run depends on the type of each
weight (ggml-cann multiplies only some quantizations), so the start-up check needs the types
before or beside the load. ggml's `gguf_init_from_file` with `no_alloc` reads the header and
the tensor infos only (milliseconds, even for a large file; the `gguf` Python package parses
every metadata array, seconds on a big vocabulary) and names types exactly as llama.cpp does.

Contract:
- `read_tensor_types(path)` returns (name, type name) of every tensor in the file, in file
  order, or raises `ModelFileError` naming the file when ggml cannot parse it.
- `matmul_weights(tensors)` keeps the weights llama.cpp multiplies by: not norms, biases or
  other 1-D parameters (recognised by name, since GGUF infos give no role), and not the token
  embedding, which is a row lookup and stays on the CPU anyway (the input layer is never
  offloaded) -- unless the model has no `output.weight`, where llama.cpp multiplies the output
  by the token embedding (tied embeddings). A weight named `*_exps.weight` is an expert matrix
  of a mixture-of-experts layer (MUL_MAT_ID, whose support can differ).
"""

from __future__ import annotations

import ctypes
from collections import Counter
from dataclasses import dataclass
from functools import cache
from pathlib import Path

from server.engine.llama_backend import c_functions

# Parameters that are never a matmul's weight, by the names llama.cpp's GGUF tensors use.
_NOT_MATMUL = ("norm", ".bias", "rope_freqs", "position_embd", "token_types", "scale")
_TOKEN_EMBD = "token_embd.weight"
_OUTPUT = "output.weight"


class ModelFileError(RuntimeError):
    """ggml could not read the GGUF file's tensor infos."""


@dataclass(frozen=True)
class WeightTensor:
    name: str
    type: str  # ggml_type_name upper-cased, as GGUF tools write it: "Q4_K", "Q8_0", "F16", "BF16"

    @property
    def is_expert(self) -> bool:
        return self.name.endswith("_exps.weight")


class _GgufInitParams(ctypes.Structure):
    _fields_ = [("no_alloc", ctypes.c_bool), ("ctx", ctypes.c_void_p)]


@cache
def _lib():
    return c_functions({
        "gguf_init_from_file": ([ctypes.c_char_p, _GgufInitParams], ctypes.c_void_p),
        "gguf_get_n_tensors": ([ctypes.c_void_p], ctypes.c_int64),
        "gguf_get_tensor_name": ([ctypes.c_void_p, ctypes.c_int64], ctypes.c_char_p),
        "gguf_get_tensor_type": ([ctypes.c_void_p, ctypes.c_int64], ctypes.c_int),
        "ggml_type_name": ([ctypes.c_int], ctypes.c_char_p),
        "gguf_free": ([ctypes.c_void_p], None),
    })


def read_tensor_types(path: Path) -> list[WeightTensor]:
    lib = _lib()
    ctx = lib.gguf_init_from_file(str(path).encode(), _GgufInitParams(True, None))
    if not ctx:
        raise ModelFileError(f"{path}: ggml could not read its GGUF tensor infos")
    try:
        return [WeightTensor(lib.gguf_get_tensor_name(ctx, i).decode(errors="replace"),
                             (lib.ggml_type_name(lib.gguf_get_tensor_type(ctx, i)) or b"?").decode().upper())
                for i in range(lib.gguf_get_n_tensors(ctx))]
    finally:
        lib.gguf_free(ctx)


def matmul_weights(tensors: list[WeightTensor]) -> list[WeightTensor]:
    names = {t.name for t in tensors}
    tied = _OUTPUT not in names
    return [t for t in tensors
            if t.name.endswith(".weight") and not any(part in t.name for part in _NOT_MATMUL)
            and (t.name != _TOKEN_EMBD or tied)]


def type_counts(tensors: list[WeightTensor]) -> dict[str, int]:
    """type -> number of tensors, most frequent first."""
    return dict(Counter(t.type for t in tensors).most_common())
