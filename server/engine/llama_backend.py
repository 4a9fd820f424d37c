"""llama.cpp's process-wide backend initialisation, done once, with its log filtered.

llama-cpp-python 0.3.36 installs a log callback whose level table predates ggml's current
`enum ggml_log_level` (NONE, DEBUG, INFO, WARN, ERROR, CONT): it prints every INFO line (the
model loader's metadata dump) and hides ERROR lines as if they were DEBUG, among them the one
line a CUDA or CANN backend logs when it cannot open its driver or device. Ours reads the enum
as the vendored ggml.h declares it.

Contract: `init_once()` may be called from any thread, any number of times; the first call
installs the log callback (llama.cpp's warnings and errors go to stderr as llama.cpp wrote
them; every level when this module's logger is at DEBUG) and calls `llama_backend_init`.
Anything that makes ggml open its backends (a device probe, a model load) calls it first.

`c_functions(signatures)` declares C functions the bindings do not (ggml's backend registry,
its GGUF reader) on the libllama llama_cpp loaded: dlsym on that handle also finds the symbols
of the ggml libraries it links, so they are the very ones llama.cpp runs with. It raises
`MissingSymbol` naming the first function the library lacks.
"""

from __future__ import annotations

import ctypes
import logging
import sys
import threading
from typing import Any

import llama_cpp

log = logging.getLogger(__name__)

# enum ggml_log_level (ggml/include/ggml.h): 0 NONE, 1 DEBUG, 2 INFO, 3 WARN, 4 ERROR, 5 CONT
_LEVELS = {0: logging.CRITICAL, 1: logging.DEBUG, 2: logging.INFO, 3: logging.WARNING, 4: logging.ERROR}
_CONT = 5

_lock = threading.Lock()
_ready = False
_threshold = logging.WARNING
_last_level = logging.INFO  # a CONT piece continues the previous line at its level


@llama_cpp.llama_log_callback
def _log_callback(level: int, text: bytes, user_data) -> None:
    global _last_level
    py_level = _last_level if level == _CONT else _LEVELS.get(level, logging.ERROR)
    _last_level = py_level
    if py_level >= _threshold:
        sys.stderr.write(text.decode("utf-8", errors="replace"))
        sys.stderr.flush()


def init_once() -> None:
    global _ready, _threshold
    with _lock:
        if not _ready:
            _threshold = logging.DEBUG if log.isEnabledFor(logging.DEBUG) else logging.WARNING
            # the module-level callback object stays referenced for the life of the process
            llama_cpp.llama_log_set(_log_callback, None)
            llama_cpp.llama_backend_init()
            _ready = True


class MissingSymbol(RuntimeError):
    """The loaded llama.cpp library does not export a C function arbor-server declares."""


def c_functions(signatures: dict[str, tuple[list[Any], Any]]) -> ctypes.CDLL:
    """libllama with each `name: (argtypes, restype)` declared."""
    lib = llama_cpp.llama_cpp._lib
    for name, (argtypes, restype) in signatures.items():
        try:
            fn = getattr(lib, name)
        except AttributeError as exc:
            raise MissingSymbol(f"the loaded llama.cpp library has no {name}: not the library llama-cpp-python "
                                f"{llama_cpp.__version__} vendors") from exc
        fn.argtypes, fn.restype = argtypes, restype
    return lib
