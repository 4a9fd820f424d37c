"""libarbor-spec: Arbor's C ABI over llama.cpp's drafters (native/tools/arbor-spec/), loaded once.

The drafter (server.engine.speculative.drafter) drives it. It lives beside the libllama the bindings loaded
(also under LLAMA_CPP_LIB_PATH); a build without it is not Arbor's.
"""

from __future__ import annotations

import ctypes
from functools import cache
from typing import Any

import llama_cpp

from server.engine import native_library

ABI_VERSION = 1


class SpecLibraryMissing(RuntimeError):
    """The llama.cpp build has no (or another version of) libarbor-spec: not Arbor's build."""


class SpecParams(ctypes.Structure):
    """struct arbor_spec_params (arbor-spec.h): llama-server's --spec-* flags as numbers."""

    _fields_ = [
        ("types", ctypes.c_char_p),
        ("n_lanes", ctypes.c_int32),
        ("draft_n_max", ctypes.c_int32),
        ("draft_n_min", ctypes.c_int32),
        ("draft_p_min", ctypes.c_float),
        ("ctx_tgt", ctypes.c_void_p),
        ("ctx_dft", ctypes.c_void_p),
        ("ngram_simple_size_n", ctypes.c_int32),
        ("ngram_simple_size_m", ctypes.c_int32),
        ("ngram_simple_min_hits", ctypes.c_int32),
        ("ngram_map_k_size_n", ctypes.c_int32),
        ("ngram_map_k_size_m", ctypes.c_int32),
        ("ngram_map_k_min_hits", ctypes.c_int32),
        ("ngram_map_k4v_size_n", ctypes.c_int32),
        ("ngram_map_k4v_size_m", ctypes.c_int32),
        ("ngram_map_k4v_min_hits", ctypes.c_int32),
        ("ngram_mod_n_match", ctypes.c_int32),
        ("ngram_mod_n_min", ctypes.c_int32),
        ("ngram_mod_n_max", ctypes.c_int32),
        ("ngram_cache_static", ctypes.c_char_p),
        ("ngram_cache_dynamic", ctypes.c_char_p),
    ]


_token_p = ctypes.POINTER(llama_cpp.llama_token)
_i32_p = ctypes.POINTER(ctypes.c_int32)
_err = ctypes.POINTER(ctypes.c_void_p)
_SIGNATURES: dict[str, tuple[list[Any], Any]] = {
    "arbor_spec_abi_version": ([], ctypes.c_int),
    "arbor_spec_default_params": ([ctypes.POINTER(SpecParams)], None),
    "arbor_spec_all_types": ([], ctypes.c_char_p),
    "arbor_spec_init": ([ctypes.POINTER(SpecParams), _err], ctypes.c_void_p),
    "arbor_spec_free": ([ctypes.c_void_p], None),
    "arbor_spec_n_max": ([ctypes.c_void_p], ctypes.c_int32),
    "arbor_spec_begin": ([ctypes.c_void_p, ctypes.c_int32, _token_p, ctypes.c_int32], ctypes.c_int32),
    "arbor_spec_push": ([ctypes.c_void_p, ctypes.c_int32, _token_p, ctypes.c_int32], ctypes.c_int32),
    "arbor_spec_draft": ([ctypes.c_void_p, ctypes.c_int32, _i32_p, _token_p, _i32_p, _i32_p, _token_p,
                          ctypes.c_int32, _i32_p, _err], ctypes.c_int32),
    "arbor_spec_accept": ([ctypes.c_void_p, ctypes.c_int32, ctypes.c_int32], ctypes.c_int32),
    "arbor_spec_string_free": ([ctypes.c_void_p], None),
}


@cache
def spec_library() -> ctypes.CDLL:
    return native_library.load("arbor-spec", "native/tools/arbor-spec", _SIGNATURES, "arbor_spec_abi_version",
                               ABI_VERSION, SpecLibraryMissing)


def default_params() -> SpecParams:
    """llama.cpp's own defaults for every --spec-* number (common_params_speculative)."""
    params = SpecParams()
    spec_library().arbor_spec_default_params(ctypes.byref(params))
    return params


def all_types() -> tuple[str, ...]:
    """Every --spec-type name the pinned llama.cpp knows."""
    return tuple(t.strip() for t in spec_library().arbor_spec_all_types().decode().split(",") if t.strip())


def take_error(err: ctypes.c_void_p, default: str) -> str:
    """The message the library set in `err` (freed), else `default`."""
    if not err.value:
        return default
    try:
        return ctypes.string_at(err.value).decode("utf-8", errors="replace")
    finally:
        spec_library().arbor_spec_string_free(err.value)
