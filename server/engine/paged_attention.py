"""Paged attention over the unified KV: the switch into our llama.cpp patch (patches/llama.cpp/).

With one unified KV stream, stock llama.cpp's attention spans every cell up to the highest
one in use and masks out other sequences' cells; every kept prefix, parked copy and idle
slot costs every running sequence at every step. The patch keeps, per sequence, a count of
its cells in each page of `page_size` cells, passes each ubatch token's page list to the
flash-attention operator, and the CPU kernel visits only those pages (the mask still applies
inside them, so shared pages and partly filled pages stay exact; a page that holds only the
sequence's earlier cells is marked and read without its mask, native/src/llama-kv-pages.h).

Contract:
- `compiled_in()` says whether the loaded llama.cpp library carries the patch (the C symbol
  `llama_set_paged_attn` exists); it never raises.
- `enable(ctx, page_size)` turns it on for one context, before its first decode, or raises
  `PagedAttentionUnavailable` with the reason llama.cpp gave (flash attention off, not one
  unified plain KV cache, KV on a backend without a paged kernel, page size too large).
- `configure(ctx, mode, page_size, offloaded=...)` applies a `--paged-attn` mode: "on" must
  succeed (else `PagedAttentionUnavailable`), "auto" turns it on where it was measured to pay
  (the CPU backend: not with layers offloaded, where the CUDA kernels are correct but were measured
  slower than llama.cpp's own on an H200) and says why not otherwise, "off" leaves llama.cpp's attention as it is. It
  returns what is in force. The CPU kernel reads every KV type (`--cache-type-k/-v`: its
  per-row path dequantizes K and V as llama.cpp's does); "on" with layers offloaded and a
  KV type other than f16 raises (CUDA's paged kernel reads f16 only).
- `set_owned_pages(ctx, owned)` chooses where tokens go with pages on: owned (native/src/llama-kv-pages.cpp: each
  sequence fills pages of its own) or llama.cpp's placement (the next free cells, so the decode
  tokens of sequences running together share pages). LlamaRuntime sets it from
  `RuntimeConfig.page_placement` (default llama.cpp's placement; the server's --page-placement
  defaults to owned).
- `set_self_check(ctx, True)` has llama.cpp check every paged mask it builds (slow; for tests):
  the page lists against a scan of the cells, the mask inside the pages against llama.cpp's
  own, and no cell a token may attend to outside its pages (and, CPU only, it writes NaN into
  the mask entries the kernel must not read, so a read shows in the logits); `self_check_failures(ctx)` counts
  the ubatches that failed (llama.cpp logs the first difference of each). It starts on in a
  debug build of llama.cpp and wherever LLAMA_PAGED_ATTN_SELF_CHECK is a number other than 0
  (LLAMA_PAGED_ATTN_SELF_CHECK: a server can be asked to check itself; /props reports it); `self_check(ctx)` says
  whether it is on and how many ubatches failed. `inject_mask_fault(ctx)` (tests only;
  native/src/llama-kv-paged-mask.cpp) arms a one-shot fault: the next paged mask drops one entry the kernel
  reads that llama.cpp's mask keeps (the first of the ubatch's first token that has one), as a bug in the mask
  builder would, so a test can see the self-check count a real wrong mask and the logits move.
- `seq_pages(ctx, seq_id)` lists the pages a sequence's attention walks (ascending page
  indices), or None when paged attention is off. With owned pages a page is shared only
  through seq_cp, or when the cache is too full for a free page, so a sequence of n cells alone
  walks ceil(n / page_size) pages.
"""

from __future__ import annotations

import ctypes
from dataclasses import dataclass
from functools import cache
from typing import Literal

import llama_cpp

_REASONS = {
    -1: "flash attention is off (--flash-attn off); the paged kernel is a flash-attention kernel",
    -2: "the model's memory is not one plain unified KV cache (sliding-window, recurrent or hybrid models)",
    -3: "the KV cache is on a backend without a paged-attention kernel (this build has one for the CPU and "
        "CUDA; none for CANN or others: docs/paged-attention.md)",
    -4: "--page-size is larger than the KV cache",
    -5: "the KV cache has more than 262,144 pages of --page-size cells (a page-table entry holds the page's index "
        "in 18 bits): raise --page-size",
}


class PagedAttentionUnavailable(RuntimeError):
    """--paged-attn was asked for but this build or this context cannot run it."""


@cache
def _set_paged_attn():
    lib = llama_cpp.llama_cpp._lib
    try:
        set_fn = lib.llama_set_paged_attn
    except AttributeError:
        return None
    set_fn.argtypes, set_fn.restype = [ctypes.c_void_p, ctypes.c_uint32], ctypes.c_int32
    return set_fn


def compiled_in() -> bool:
    return _set_paged_attn() is not None


def enable(ctx, page_size: int) -> None:
    set_paged_attn = _set_paged_attn()
    if set_paged_attn is None:
        raise PagedAttentionUnavailable(
            "this llama-cpp-python build has no paged attention: it was not built from Arbor's patched "
            "source (run scripts/setup.sh, which applies patches/llama.cpp/)")
    code = set_paged_attn(ctx, page_size)
    if code != 0:
        raise PagedAttentionUnavailable(_REASONS.get(code, f"llama_set_paged_attn returned {code}"))


@dataclass(frozen=True)
class PagedAttentionStatus:
    """What /props reports: whether the build has it, the page size in force (0: off), why off."""

    compiled_in: bool
    page_size: int
    note: str | None = None

    @property
    def enabled(self) -> bool:
        return self.page_size > 0


def configure(ctx, mode: Literal["auto", "on", "off"], page_size: int, *,
              offloaded: bool = False, kv_types: tuple[str, str] = ("f16", "f16")) -> PagedAttentionStatus:
    if mode == "off":
        return PagedAttentionStatus(compiled_in(), 0, "turned off (--paged-attn off)")
    if mode == "auto" and offloaded:
        # measured on an H200 (docs/benchmark-notes.md, "Paged attention on a GPU"): correct, but slower there
        return PagedAttentionStatus(compiled_in(), 0, "layers are offloaded to an accelerator, where paged attention "
                                    "was measured slower than llama.cpp's own (CUDA: its decode kernel and the "
                                    "seed's shape through the server): turn it on with --paged-attn on")
    if offloaded and kv_types != ("f16", "f16"):
        # CUDA's paged kernel reads f16 K and V only; any other type would run llama.cpp's own kernel over every
        # cell (masked outside the pages: right, but not paged). The CPU kernel reads every KV type.
        raise PagedAttentionUnavailable(
            f"--paged-attn on with layers offloaded runs CUDA's paged kernel, which reads f16 K and V only "
            f"(--cache-type-k {kv_types[0]} --cache-type-v {kv_types[1]}): use f16 or --paged-attn auto|off")
    try:
        enable(ctx, page_size)
    except PagedAttentionUnavailable as exc:
        if mode == "on":
            raise
        return PagedAttentionStatus(compiled_in(), 0, str(exc))
    return PagedAttentionStatus(True, page_size)


@cache
def _bound(name: str, argtypes: tuple, restype):
    """A function of the patched library with its ctypes signature, bound once."""
    fn = getattr(llama_cpp.llama_cpp._lib, name)
    fn.argtypes, fn.restype = list(argtypes), restype
    return fn


def seq_pages(ctx, seq_id: int) -> list[int] | None:
    get = _bound("llama_get_paged_attn_seq_pages",
                 (ctypes.c_void_p, ctypes.c_int32, ctypes.POINTER(ctypes.c_int32), ctypes.c_int32), ctypes.c_int32)
    n = get(ctx, seq_id, None, 0)
    if n < 0:
        return None
    out = (ctypes.c_int32 * max(n, 1))()
    n = get(ctx, seq_id, out, n)
    return list(out[:n])


def set_owned_pages(ctx, owned: bool) -> None:
    # -2: not a plain KV cache (sliding-window, recurrent, hybrid), where paging never runs: nothing to place
    _bound("llama_set_paged_attn_own_pages", (ctypes.c_void_p, ctypes.c_bool), ctypes.c_int32)(ctx, owned)


def defragment(ctx) -> int:
    """Move the cells a full cache put among another sequence's cells into pages of their own sequences
    (llama_paged_attn_defrag), as far as free cells allow; call it between decodes. Returns the cells moved,
    0 where nothing applies (paging off, llama.cpp's placement, another kind of KV, a K-shift pending)."""
    moved = _bound("llama_paged_attn_defrag", (ctypes.c_void_p,), ctypes.c_int32)(ctx)
    return max(int(moved), 0)


def set_self_check(ctx, on: bool) -> None:
    if _bound("llama_set_paged_attn_self_check", (ctypes.c_void_p, ctypes.c_bool), ctypes.c_int32)(ctx, on) != 0:
        raise PagedAttentionUnavailable("the model's memory is not a plain KV cache: there is no paged mask to check")


def inject_mask_fault(ctx) -> None:
    if _bound("llama_paged_attn_inject_mask_fault", (ctypes.c_void_p,), ctypes.c_int32)(ctx) != 0:
        raise PagedAttentionUnavailable("the model's memory is not a plain KV cache: there is no paged mask to fault")


def self_check_failures(ctx) -> int:
    return int(_bound("llama_get_paged_attn_self_check_failures", (ctypes.c_void_p,), ctypes.c_int64)(ctx))


@dataclass(frozen=True)
class SelfCheck:
    """Whether llama.cpp checks every paged mask it builds, and how many ubatches failed the check."""

    on: bool
    failures: int


def self_check(ctx) -> SelfCheck | None:
    """None when the model's memory is not a plain KV cache (nothing paged to check)."""
    on = int(_bound("llama_get_paged_attn_self_check", (ctypes.c_void_p,), ctypes.c_int32)(ctx))
    if on < 0:
        return None
    return SelfCheck(on == 1, max(self_check_failures(ctx), 0))
