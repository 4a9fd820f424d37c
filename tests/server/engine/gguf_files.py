"""Small GGUF files with chosen weight types, written with the `gguf` package, for tests that
read tensor infos (no model is loaded from them: the tensor data are zeros)."""

from __future__ import annotations

from pathlib import Path

import numpy as np


def write_gguf(path: Path, tensors: dict[str, str]) -> Path:
    """A GGUF file holding one 2 x 256 tensor of each given type ("Q4_K", "F32", ...) by name."""
    gguf = __import__("pytest").importorskip("gguf")
    writer = gguf.GGUFWriter(str(path), "llama")
    for name, type_name in tensors.items():
        qtype = gguf.GGMLQuantizationType[type_name]
        if qtype == gguf.GGMLQuantizationType.F32:
            writer.add_tensor(name, np.zeros((2, 256), np.float32))
            continue
        block, block_bytes = gguf.GGML_QUANT_SIZES[qtype]
        writer.add_tensor(name, np.zeros((2, 256 // block * block_bytes), np.uint8), raw_dtype=qtype)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path
