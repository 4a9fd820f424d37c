"""Loading one of Arbor's native libraries (native/tools/: libarbor-chat, libarbor-spec) beside the libllama the
bindings loaded (also under LLAMA_CPP_LIB_PATH), with its functions' ctypes signatures and its ABI version checked:
a build without it, or of another version, is not Arbor's, and says how to fix that."""

from __future__ import annotations

import ctypes
from pathlib import Path
from typing import Any

import llama_cpp


def library_folder() -> Path:
    """Where libllama was loaded from: the native libraries are installed beside it."""
    return Path(llama_cpp.llama_cpp._lib._name).resolve().parent


def load(name: str, source: str, signatures: dict[str, tuple[list[Any], Any]], abi_function: str, abi_version: int,
         missing: type[RuntimeError]) -> ctypes.CDLL:
    """lib`name`.so with `signatures` set; raises `missing` when the file, a function or the ABI version is not
    what this server speaks (`source`: its folder under native/, named in the message)."""
    path = library_folder() / f"lib{name}.so"
    if not path.exists():
        raise missing(f"{path} is missing: llama-cpp-python was not built by scripts/setup.sh with Arbor's native "
                      f"sources ({source})")
    lib = ctypes.CDLL(str(path))
    try:
        for function, (argtypes, restype) in signatures.items():
            fn = getattr(lib, function)
            fn.argtypes, fn.restype = argtypes, restype
    except AttributeError as exc:
        raise missing(f"{path} lacks {exc}: an older build of {source} (run scripts/setup.sh)") from exc
    have = getattr(lib, abi_function)()
    if have != abi_version:
        raise missing(f"{path} speaks ABI {have}, this server {abi_version} (run scripts/setup.sh)")
    return lib
