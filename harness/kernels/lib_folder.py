"""A folder of llama.cpp libraries for LLAMA_CPP_LIB_PATH (`bench.fa_kernel --libs`, `bench.engine_throughput
--arbor-lib`, `ggml_fa`), checked before a measurement uses it.

A wheel's `lib/` holds each library under every name the loader asks for (`libggml-cpu.so`, `.so.0`,
`.so.0.25.3`) as separate copies, not links: ctypes opens `libggml-cpu.so` while libllama loads the `.so.0`.
A folder made by copying a wheel's and replacing one of those files with another build's therefore runs two
different libraries in one process, and a comparison measures the wrong one without a sign. `check_lib_folder`
refuses such a folder: the names of one library must all be links to, or copies of, the same file.
"""

from __future__ import annotations

import hashlib
import re
from collections import defaultdict
from pathlib import Path

_NAME = re.compile(r"^(lib[\w.+-]+?)\.so(\.[\d.]+)?$")


class LibFolderError(ValueError):
    """A folder whose names of one library are different files."""


def _digest(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def check_lib_folder(folder: Path) -> None:
    """Raise LibFolderError unless every library in `folder` is one file under all its names (`libX.so`,
    `libX.so.N`, ...: links to it or identical copies), or the folder has no library at all."""
    if not folder.is_dir():
        raise LibFolderError(f"{folder}: not a folder")
    names: dict[str, list[Path]] = defaultdict(list)
    for path in sorted(folder.iterdir()):
        m = _NAME.match(path.name)
        if m and path.is_file():
            names[m.group(1)].append(path)
    for lib, paths in names.items():
        files = {p.name: p.resolve() for p in paths}
        by_file = {f: _digest(f) for f in set(files.values())}  # names that link to one file read it once
        digests = {name: by_file[f] for name, f in files.items()}
        if len(set(digests.values())) > 1:
            groups: dict[str, list[str]] = defaultdict(list)
            for name, digest in digests.items():
                groups[digest].append(name)
            listed = "; ".join(", ".join(group) for group in groups.values())
            raise LibFolderError(f"{folder}: the names of {lib} are different files ({listed}); the loader and "
                                 f"ctypes would open different builds: replace every one of them (or make the "
                                 f"others links to one)")
