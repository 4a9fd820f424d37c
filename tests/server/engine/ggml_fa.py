"""Runs ggml's flash-attention operator on the CPU from Python (ctypes over the ggml libraries
that llama-cpp-python ships), with and without a paged-attention page table.

Only for operator tests: it builds a one-op graph in a ggml context, fills the inputs from
numpy arrays and computes it with ggml's CPU backend.
"""

from __future__ import annotations

import ctypes
import os
from pathlib import Path

import llama_cpp
import numpy as np

GGML_TYPE_F32 = 0
GGML_TYPE_F16 = 1
GGML_TYPE_I32 = 26


class _InitParams(ctypes.Structure):
    _fields_ = [("mem_size", ctypes.c_size_t), ("mem_buffer", ctypes.c_void_p), ("no_alloc", ctypes.c_bool)]


def _lib_dir() -> Path:
    override = os.environ.get("LLAMA_CPP_LIB_PATH")
    return Path(override) if override else Path(llama_cpp.__file__).parent / "lib"


def _load() -> tuple[ctypes.CDLL, ctypes.CDLL]:
    d = _lib_dir()
    base = ctypes.CDLL(str(d / "libggml-base.so"), mode=ctypes.RTLD_GLOBAL)
    cpu = ctypes.CDLL(str(d / "libggml-cpu.so"), mode=ctypes.RTLD_GLOBAL)
    p = ctypes.c_void_p
    base.ggml_init.argtypes, base.ggml_init.restype = [_InitParams], p
    base.ggml_free.argtypes, base.ggml_free.restype = [p], None
    base.ggml_new_tensor_4d.argtypes = [p, ctypes.c_int, ctypes.c_int64, ctypes.c_int64, ctypes.c_int64, ctypes.c_int64]
    base.ggml_new_tensor_4d.restype = p
    base.ggml_get_data.argtypes, base.ggml_get_data.restype = [p], p
    base.ggml_nbytes.argtypes, base.ggml_nbytes.restype = [p], ctypes.c_size_t
    base.ggml_flash_attn_ext.argtypes = [p, p, p, p, p, ctypes.c_float, ctypes.c_float, ctypes.c_float]
    base.ggml_flash_attn_ext.restype = p
    base.ggml_new_graph.argtypes, base.ggml_new_graph.restype = [p], p
    base.ggml_build_forward_expand.argtypes, base.ggml_build_forward_expand.restype = [p, p], None
    cpu.ggml_graph_compute_with_ctx.argtypes = [p, p, ctypes.c_int]
    cpu.ggml_graph_compute_with_ctx.restype = ctypes.c_int
    cpu.ggml_cpu_init.argtypes, cpu.ggml_cpu_init.restype = [], None
    if hasattr(base, "ggml_flash_attn_ext_set_pages"):
        base.ggml_flash_attn_ext_set_pages.argtypes = [p, p, ctypes.c_int32]
        base.ggml_flash_attn_ext_set_pages.restype = None
    cpu.ggml_cpu_init()
    return base, cpu


_libs: tuple[ctypes.CDLL, ctypes.CDLL] | None = None


def libs() -> tuple[ctypes.CDLL, ctypes.CDLL]:
    global _libs
    if _libs is None:
        _libs = _load()
    return _libs


def has_paged_op() -> bool:
    return hasattr(libs()[0], "ggml_flash_attn_ext_set_pages")


def flash_attn(q: np.ndarray, k: np.ndarray, v: np.ndarray, mask: np.ndarray, *, scale: float,
               pages: np.ndarray | None = None, page_size: int = 0, n_threads: int = 2) -> np.ndarray:
    """Attention of q [n_head, n_tokens, DK] over k [n_head_kv, n_kv, DK], v [n_head_kv, n_kv, DV]
    with mask [n_tokens, n_kv] (0 or -inf), K/V/mask rounded to f16 as llama.cpp stores them.
    pages: int32 [n_tokens, 2 + n_pages_max] rows {n, tag, p_0..p_{n-1}} (equal tags, equal lists).
    Returns [n_tokens, n_head, DV]."""
    base, cpu = libs()
    n_head, n_tokens, dk = q.shape
    n_head_kv, n_kv, _ = k.shape
    dv = v.shape[2]
    size = (q.nbytes + k.nbytes + v.nbytes + mask.nbytes * 2 + n_tokens * n_head * dv * 4
            + (pages.nbytes if pages is not None else 0) + (64 << 20))
    ctx = base.ggml_init(_InitParams(size, None, False))
    assert ctx, "ggml_init failed"
    try:
        def tensor(kind: int, arr: np.ndarray, dims: tuple[int, ...]):
            t = base.ggml_new_tensor_4d(ctx, kind, *dims)
            assert base.ggml_nbytes(t) == arr.nbytes, (base.ggml_nbytes(t), arr.nbytes)
            ctypes.memmove(base.ggml_get_data(t), np.ascontiguousarray(arr).ctypes.data, arr.nbytes)
            return t

        tq = tensor(GGML_TYPE_F32, q.astype(np.float32), (dk, n_tokens, n_head, 1))
        tk = tensor(GGML_TYPE_F16, k.astype(np.float16), (dk, n_kv, n_head_kv, 1))
        tv = tensor(GGML_TYPE_F16, v.astype(np.float16), (dv, n_kv, n_head_kv, 1))
        tm = tensor(GGML_TYPE_F16, mask.astype(np.float16), (n_kv, n_tokens, 1, 1))
        out = base.ggml_flash_attn_ext(ctx, tq, tk, tv, tm, scale, 0.0, 0.0)
        if pages is not None:
            tp = tensor(GGML_TYPE_I32, pages.astype(np.int32), (pages.shape[1], n_tokens, 1, 1))
            base.ggml_flash_attn_ext_set_pages(out, tp, page_size)
        gf = base.ggml_new_graph(ctx)
        base.ggml_build_forward_expand(gf, out)
        assert cpu.ggml_graph_compute_with_ctx(ctx, gf, n_threads) == 0
        result = np.empty((n_tokens, n_head, dv), dtype=np.float32)
        ctypes.memmove(result.ctypes.data, base.ggml_get_data(out), result.nbytes)
        return result
    finally:
        base.ggml_free(ctx)


def reference(q: np.ndarray, k: np.ndarray, v: np.ndarray, mask: np.ndarray, *, scale: float) -> np.ndarray:
    """Masked softmax attention in float64 over the f16-rounded K/V (grouped-query heads)."""
    n_head, n_tokens, _ = q.shape
    n_head_kv = k.shape[0]
    kf = k.astype(np.float16).astype(np.float64)
    vf = v.astype(np.float16).astype(np.float64)
    out = np.zeros((n_tokens, n_head, v.shape[2]))
    for h in range(n_head):
        hk = h // (n_head // n_head_kv)
        s = q[h].astype(np.float64) @ kf[hk].T * scale + mask
        m = s.max(axis=1, keepdims=True)
        p = np.exp(s - m)
        p /= p.sum(axis=1, keepdims=True)
        out[:, h, :] = p @ vf[hk]
    return out
