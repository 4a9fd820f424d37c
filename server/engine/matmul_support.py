"""Which weight types an accelerator backend multiplies, as the vendored llama.cpp (0.3.36) says.

When a backend's `supports_op` refuses a MUL_MAT for a weight's type, llama.cpp's loader puts
that weight in a CPU buffer and the multiplication runs on the CPU, announced only by one
DEBUG line. The tables below copy the type switches of `supports_op` for GGML_OP_MUL_MAT and
GGML_OP_MUL_MAT_ID:
- ggml/src/ggml-cann/ggml-cann.cpp, ggml_backend_cann_supports_op. A build for a 310P SoC
  (compiled with ASCEND_310P, i.e. -DSOC_TYPE=Ascend310P*) multiplies F32 and F16 only; every
  other SoC (910B, ...) also Q8_0 and Q4_0 (contiguous, as GGUF weights are) and, for plain
  MUL_MAT, BF16.
- ggml/src/ggml-cuda/ggml-cuda.cu, ggml_backend_cuda_device_supports_op: every type GGUF files
  commonly hold.
A new llama.cpp release must be read again here (docs/paged-attention.md, "A new release").

Contract: `unsupported(backend, soc, weights)` returns type -> tensor count of the weights that
backend does not multiply (empty: all run on it), or None when this table does not know the
backend (then nothing is claimed either way). `needed_types(backend, soc)` is what the backend
does multiply, for the message that names the fix.
"""

from __future__ import annotations

from collections import Counter

from server.engine.model_weights import WeightTensor

_CANN_910B = frozenset({"F32", "F16", "BF16", "Q8_0", "Q4_0"})
_CANN_910B_EXPERTS = frozenset({"F32", "F16", "Q8_0", "Q4_0"})  # MUL_MAT_ID: no BF16 case
_CANN_310P = frozenset({"F32", "F16"})  # both ops: "Q4 && Q8 per group is not support on 310p device"
_CUDA = frozenset({
    "F32", "F16", "BF16", "Q1_0", "Q2_0", "Q4_0", "Q4_1", "Q5_0", "Q5_1", "Q8_0", "MXFP4", "NVFP4",
    "Q2_K", "Q3_K", "Q4_K", "Q5_K", "Q6_K", "Q8_K", "IQ1_M", "IQ1_S", "IQ2_S", "IQ2_XS", "IQ2_XXS",
    "IQ3_S", "IQ3_XXS", "IQ4_NL", "IQ4_XS",
})


def cann_family(soc: str) -> str:
    """"310P" for a 310P SoC name (Ascend310P3, ...), else "910B": the only distinction the
    vendored CANN backend compiles in (ASCEND_310P)."""
    return "310P" if "310P" in soc.upper() else "910B"


def _table(backend: str, soc: str | None, expert: bool) -> frozenset[str] | None:
    if backend == "CANN":
        if cann_family(soc or "") == "310P":
            return _CANN_310P
        return _CANN_910B_EXPERTS if expert else _CANN_910B
    if backend == "CUDA":
        return _CUDA
    return None


def unsupported(backend: str, soc: str | None, weights: list[WeightTensor]) -> dict[str, int] | None:
    if _table(backend, soc, expert=False) is None:
        return None
    missing = Counter(w.type for w in weights if w.type not in (_table(backend, soc, w.is_expert) or frozenset()))
    return dict(missing.most_common())


def needed_types(backend: str, soc: str | None) -> list[str]:
    """The types every matmul of a model must have to run on this backend (dense and expert)."""
    table = _table(backend, soc, expert=False)
    if table is None:
        return []
    return sorted(table & (_table(backend, soc, expert=True) or frozenset()))
