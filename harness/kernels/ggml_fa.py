"""Runs ggml's flash-attention operator on the CPU from Python (ctypes over the ggml libraries
that llama-cpp-python ships, or those in LLAMA_CPP_LIB_PATH), with and without a paged-attention
page table.

For the operator tests (tests/server/engine/test_paged_attention_op.py) and the kernel benchmark
(fa_kernel.py): it builds a one-op graph in a ggml context, fills the inputs from numpy
arrays and computes it with ggml's CPU backend; given a `ggml_backend.Backend` (the kernel check on an
accelerator, paged_kernel_check.py), it allocates the tensors on that backend and computes there.
"""

from __future__ import annotations

import ctypes
import functools
import os
from pathlib import Path
from typing import TYPE_CHECKING

import llama_cpp
import numpy as np

from harness.kernels.lib_folder import check_lib_folder

if TYPE_CHECKING:
    from harness.kernels.ggml_backend import Backend

GGML_TYPE_F32 = 0
GGML_TYPE_F16 = 1
GGML_TYPE_I32 = 26

# ggml.h (the page-table topic): a page index in a page-table row may carry the flag GGML_FA_PAGE_UNMASKED (the mask is
# 0 at every cell of the row's part of that page, and the kernel does not read it there) and a cut (bits 18-29: the
# row's part of the page ends that many cells before the page does; the cells after are outside the row's pages)
GGML_FA_PAGE_UNMASKED = 1 << 30
GGML_FA_PAGE_CUT_SHIFT = 18
GGML_FA_PAGE_SIZE_MAX = 1 << 12
GGML_FA_PAGE_INDEX = (1 << GGML_FA_PAGE_CUT_SHIFT) - 1  # a page index without its flag and cut


GGML_FA_ROW_INTS = 4  # ggml.h (the page-table topic): a query row's header in the page table, { n, tag, off, last }


def pack_page_table(rows: np.ndarray) -> np.ndarray:
    """ggml_flash_attn_ext_set_pages' table (one list per tag) from one page list per query row, `rows` int [n_rows,
    2 + n_pages_max] of {n, tag, p_0..p_{n-1}}: a header per row {n, tag, off, last}, then one list per tag (its
    longest row's), which every row of the tag reads up to its own end but for its last entry, its own. Raises
    ValueError for rows of one tag that are not prefixes of one list but for their last page's marks (the contract:
    the same page, its own cut)."""
    rows = np.asarray(rows, dtype=np.int64)
    n_rows = rows.shape[0]
    longest: dict[int, int] = {}
    for r in range(n_rows):
        tag = int(rows[r, 1])
        if tag not in longest or rows[r, 0] > rows[longest[tag], 0]:
            longest[tag] = r
    header = np.zeros((n_rows, GGML_FA_ROW_INTS), np.int64)
    offsets: dict[int, int] = {}
    lists: list[np.ndarray] = []
    off = GGML_FA_ROW_INTS * n_rows
    for tag, r in longest.items():
        offsets[tag] = off
        lists.append(rows[r, 2:2 + int(rows[r, 0])])
        off += int(rows[r, 0])
    for r in range(n_rows):
        n, tag = int(rows[r, 0]), int(rows[r, 1])
        shared = rows[longest[tag]]
        if not (np.array_equal(rows[r, 2:1 + n], shared[2:1 + n])
                and (n == 0 or (rows[r, 1 + n] & GGML_FA_PAGE_INDEX) == (shared[1 + n] & GGML_FA_PAGE_INDEX))):
            raise ValueError(f"row {r} (tag {tag}) is no prefix of its tag's longest list but for its last page's "
                             "marks")
        header[r] = (n, tag, offsets[tag], rows[r, 1 + n] if n > 0 else 0)
    return np.concatenate([header.ravel(), *lists]).astype(np.int32)


def page_cut(entry: int) -> int:
    """The cut of a page-table entry (GGML_FA_PAGE_CUT)."""
    return (int(entry) >> GGML_FA_PAGE_CUT_SHIFT) & (GGML_FA_PAGE_SIZE_MAX - 1)


class _InitParams(ctypes.Structure):
    _fields_ = [("mem_size", ctypes.c_size_t), ("mem_buffer", ctypes.c_void_p), ("no_alloc", ctypes.c_bool)]


def lib_dir() -> Path:
    """The folder of the libraries: LLAMA_CPP_LIB_PATH's (checked: lib_folder), else llama-cpp-python's own."""
    override = os.environ.get("LLAMA_CPP_LIB_PATH")
    return _checked_folder(override) if override else Path(llama_cpp.__file__).parent / "lib"


@functools.cache
def _checked_folder(folder: str) -> Path:
    """`folder` once check_lib_folder passed it: once per process (it reads every library in it)."""
    check_lib_folder(Path(folder))
    return Path(folder)


def _load() -> tuple[ctypes.CDLL, ctypes.CDLL]:
    d = lib_dir()
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
    base.ggml_flash_attn_ext_add_sinks.argtypes, base.ggml_flash_attn_ext_add_sinks.restype = [p, p], None
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


class FlashAttnGraph:
    """One flash-attention op in a ggml context of its own, built once: `compute()` runs it again (the
    operator tests run it once, fa_kernel.py times it), `result()` reads the output. Shapes and the
    meaning of the arguments: `flash_attn`. Close it (or use it as a context manager) to free the context."""

    def __init__(self, q: np.ndarray, k: np.ndarray, v: np.ndarray, mask: np.ndarray, *, scale: float,
                 pages: np.ndarray | None = None, page_size: int = 0, softcap: float = 0.0,
                 sinks: np.ndarray | None = None, backend: Backend | None = None):
        base, _ = libs()
        n_head, n_tokens, dk = q.shape
        n_head_kv, n_kv, _ = k.shape
        dv = v.shape[2]
        self.shape = (n_tokens, n_head, dv)
        self.backend = backend
        self.buffer = None
        if backend is None:  # tensors and the graph's work buffer in the context
            size = (q.nbytes + k.nbytes + v.nbytes + mask.nbytes * 2 + n_tokens * n_head * dv * 4
                    + (pages.nbytes if pages is not None else 0) + (sinks.nbytes if sinks is not None else 0)
                    + (64 << 20))
            self.ctx = base.ggml_init(_InitParams(size, None, False))
        else:  # tensor headers and the graph in the context, the data on the backend (the backend calls, overheads
            # included, were bound by ggml_backend when the Backend was opened)
            self.ctx = base.ggml_init(_InitParams(base.ggml_tensor_overhead() * 16 + base.ggml_graph_overhead(),
                                                  None, True))
        assert self.ctx, "ggml_init failed"
        filled: list[tuple[int, np.ndarray]] = []

        def tensor(kind: int, arr: np.ndarray, dims: tuple[int, ...]):
            t = base.ggml_new_tensor_4d(self.ctx, kind, *dims)
            assert base.ggml_nbytes(t) == arr.nbytes, (base.ggml_nbytes(t), arr.nbytes)
            filled.append((t, np.ascontiguousarray(arr)))
            return t

        tq = tensor(GGML_TYPE_F32, q.astype(np.float32), (dk, n_tokens, n_head, 1))
        tk = tensor(GGML_TYPE_F16, k.astype(np.float16), (dk, n_kv, n_head_kv, 1))
        tv = tensor(GGML_TYPE_F16, v.astype(np.float16), (dv, n_kv, n_head_kv, 1))
        tm = tensor(GGML_TYPE_F16, mask.astype(np.float16), (n_kv, n_tokens, 1, 1))
        self.out = base.ggml_flash_attn_ext(self.ctx, tq, tk, tv, tm, scale, 0.0, softcap)
        if sinks is not None:
            base.ggml_flash_attn_ext_add_sinks(self.out, tensor(GGML_TYPE_F32, sinks.astype(np.float32),
                                                                (n_head, 1, 1, 1)))
        if pages is not None:
            packed = pack_page_table(pages)
            tp = tensor(GGML_TYPE_I32, packed, (packed.size, 1, 1, 1))
            base.ggml_flash_attn_ext_set_pages(self.out, tp, page_size)
        self.graph = base.ggml_new_graph(self.ctx)
        base.ggml_build_forward_expand(self.graph, self.out)
        if backend is None:
            for t, arr in filled:
                ctypes.memmove(base.ggml_get_data(t), arr.ctypes.data, arr.nbytes)
        else:
            self.buffer = base.ggml_backend_alloc_ctx_tensors(self.ctx, backend.handle)
            assert self.buffer, f"could not allocate the inputs on {backend.device.name}"
            for t, arr in filled:
                base.ggml_backend_tensor_set(t, arr.ctypes.data, 0, arr.nbytes)

    def supported(self) -> bool:
        """Whether the backend computes this op itself (always on the CPU path)."""
        return self.backend is None or libs()[0].ggml_backend_supports_op(self.backend.handle, self.out)

    def compute(self, n_threads: int = 2) -> None:
        """Run the op and wait for it (n_threads: the CPU path's; a backend keeps its own). Raises RuntimeError
        when the backend does not compute this op (ggml would abort)."""
        if self.backend is None:
            assert libs()[1].ggml_graph_compute_with_ctx(self.ctx, self.graph, n_threads) == 0
        else:
            if not self.supported():
                raise RuntimeError(f"{self.backend.device.name} does not compute this flash-attention op "
                                   f"(ggml_backend_supports_op is false)")
            assert libs()[0].ggml_backend_graph_compute(self.backend.handle, self.graph) == 0
            self.backend.synchronize()

    def result(self) -> np.ndarray:
        result = np.empty(self.shape, dtype=np.float32)
        if self.backend is None:
            ctypes.memmove(result.ctypes.data, libs()[0].ggml_get_data(self.out), result.nbytes)
        else:
            libs()[0].ggml_backend_tensor_get(self.out, result.ctypes.data, 0, result.nbytes)
        return result

    def close(self) -> None:
        if self.buffer:
            libs()[0].ggml_backend_buffer_free(self.buffer)
            self.buffer = None
        if self.ctx:
            libs()[0].ggml_free(self.ctx)
            self.ctx = None

    def __enter__(self) -> FlashAttnGraph:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def flash_attn(q: np.ndarray, k: np.ndarray, v: np.ndarray, mask: np.ndarray, *, scale: float,
               pages: np.ndarray | None = None, page_size: int = 0, n_threads: int = 2,
               softcap: float = 0.0, sinks: np.ndarray | None = None, backend: Backend | None = None) -> np.ndarray:
    """Attention of q [n_head, n_tokens, DK] over k [n_head_kv, n_kv, DK], v [n_head_kv, n_kv, DV]
    with mask [n_tokens, n_kv] (0 or -inf), K/V/mask rounded to f16 as llama.cpp stores them.
    pages: int32 [n_tokens, 2 + n_pages_max] rows {n, tag, p_0..p_{n-1}} (rows of one tag: prefixes of one list
    but for their last entries; ggml takes them packed per tag, `pack_page_table`), a page index
    or'ed with GGML_FA_PAGE_UNMASKED where the mask is 0 throughout the row's part of the page (the kernel then does
    not read it) and with a cut (`page_cut`) where that part ends before the page does.
    softcap: the logit soft-cap (0: none); sinks: float32 [n_head], one attention sink logit per head.
    backend: compute there (ggml_backend) instead of ggml's CPU graph compute.
    Returns [n_tokens, n_head, DV]."""
    with FlashAttnGraph(q, k, v, mask, scale=scale, pages=pages, page_size=page_size, softcap=softcap,
                        sinks=sinks, backend=backend) as graph:
        graph.compute(n_threads)
        return graph.result()


def reference(q: np.ndarray, k: np.ndarray, v: np.ndarray, mask: np.ndarray, *, scale: float,
              softcap: float = 0.0, sinks: np.ndarray | None = None) -> np.ndarray:
    """Masked softmax attention in float64 over the f16-rounded K/V (grouped-query heads), with ggml's soft-cap
    (softcap * tanh(qk * scale / softcap)) and sinks (a logit per head in the softmax's sum, no value)."""
    n_head, n_tokens, _ = q.shape
    n_head_kv = k.shape[0]
    kf = k.astype(np.float16).astype(np.float64)
    vf = v.astype(np.float16).astype(np.float64)
    out = np.zeros((n_tokens, n_head, v.shape[2]))
    for h in range(n_head):
        hk = h // (n_head // n_head_kv)
        s = q[h].astype(np.float64) @ kf[hk].T * scale
        if softcap:
            s = softcap * np.tanh(s / softcap)
        s = s + mask
        m = s.max(axis=1, keepdims=True)
        if sinks is not None:
            m = np.maximum(m, float(sinks[h]))
        p = np.exp(s - m)
        total = p.sum(axis=1, keepdims=True) + (np.exp(float(sinks[h]) - m) if sinks is not None else 0.0)
        out[:, h, :] = (p / total) @ vf[hk]
    return out
