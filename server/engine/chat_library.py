"""libarbor-chat: Arbor's C ABI over llama.cpp's chat layer (native/tools/arbor-chat/), loaded once.

The API renders and parses through it (server.api.engine_bridge.chat_layer); the engine takes llama-server's
reasoning-budget sampler from it (server.engine.reasoning_budget). It lives beside the libllama
the bindings loaded (also under LLAMA_CPP_LIB_PATH); a build without it is not Arbor's.
"""

from __future__ import annotations

import ctypes
from functools import cache
from typing import Any

import llama_cpp

from server.engine import native_library

ABI_VERSION = 2


class ChatLibraryMissing(RuntimeError):
    """The llama.cpp build has no (or another version of) libarbor-chat: not Arbor's patched build."""


_c_str = ctypes.c_char_p
_err = ctypes.POINTER(ctypes.c_void_p)
_SIGNATURES: dict[str, tuple[list[Any], Any]] = {
    "arbor_chat_abi_version": ([], ctypes.c_int),
    "arbor_chat_templates_init": ([ctypes.c_void_p, _c_str, _err], ctypes.c_void_p),
    "arbor_chat_templates_free": ([ctypes.c_void_p], None),
    "arbor_chat_templates_info": ([ctypes.c_void_p], ctypes.c_void_p),
    "arbor_chat_apply": ([ctypes.c_void_p, _c_str, _err], ctypes.c_void_p),
    "arbor_chat_parser_init": ([_c_str, _err], ctypes.c_void_p),
    "arbor_chat_parser_free": ([ctypes.c_void_p], None),
    "arbor_chat_parse": ([ctypes.c_void_p, _c_str, ctypes.c_bool, _err], ctypes.c_void_p),
    "arbor_chat_reasoning_budget_init": ([ctypes.c_void_p, _c_str, _err], ctypes.c_void_p),
    "arbor_chat_reasoning_budget_state": ([ctypes.c_void_p], ctypes.c_int),
    "arbor_chat_reasoning_budget_end_match": ([ctypes.c_void_p, ctypes.POINTER(llama_cpp.llama_token), ctypes.c_int],
                                              ctypes.c_int),
    "arbor_chat_string_free": ([ctypes.c_void_p], None),
}


@cache
def chat_library() -> ctypes.CDLL:
    return native_library.load("arbor-chat", "native/tools/arbor-chat", _SIGNATURES, "arbor_chat_abi_version",
                               ABI_VERSION, ChatLibraryMissing)


def take_string(ptr: int | None) -> str | None:
    """The text of a string the library allocated, freed."""
    if not ptr:
        return None
    try:
        return ctypes.string_at(ptr).decode("utf-8", errors="replace")
    finally:
        chat_library().arbor_chat_string_free(ptr)


def error_text(err: ctypes.c_void_p, default: str) -> str:
    return take_string(err.value) or default
