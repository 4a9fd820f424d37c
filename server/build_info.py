"""What this server build is, and the `system_fingerprint` of its answers.

OpenAI's `system_fingerprint` names the backend configuration an answer came from, so a
client can tell when a change in output may come from a change of server rather than of
its own request. Ours hashes the build (Arbor's version, llama-cpp-python's and so
llama.cpp's) and the identity of the model file (the same cheap file hash the disk cache
keys its segments with): a new build or another model file gives a new fingerprint; a
restart of the same server keeps it.
"""

from __future__ import annotations

import hashlib
from importlib import metadata
from pathlib import Path

from server.cache.fingerprint import file_identity


def _version(dist: str) -> str:
    try:
        return metadata.version(dist)
    except metadata.PackageNotFoundError:
        return "unknown"


def arbor_version() -> str:
    return _version("arbor")


def build_string() -> str:
    return f"arbor-server {arbor_version()} over llama-cpp-python {_version('llama_cpp_python')}"


def version_text() -> str:
    """What `arbor-server --version` prints: the build, whether paged attention is in it, and
    the backends and devices llama.cpp opens here (a backend with 0 devices could not open its
    driver or device)."""
    from server.engine import backend_devices, paged_attention

    paged = "compiled in" if paged_attention.compiled_in() else "not compiled in (an unpatched llama-cpp-python)"
    return "\n".join([build_string(), f"paged attention: {paged}", *backend_devices.inventory().lines()])


def system_fingerprint(model_path: Path) -> str:
    doc = f"{build_string()}\n{file_identity(model_path)}"
    return "fp_" + hashlib.sha256(doc.encode()).hexdigest()[:16]
