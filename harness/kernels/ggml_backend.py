"""ggml's backends from Python (ctypes over the ggml libraries llama-cpp-python ships, or those in
LLAMA_CPP_LIB_PATH): the devices the libraries registered, and a backend opened on one of them.

ggml_fa.py runs its flash-attention graph on such a backend when given one (the kernel check on an
accelerator, paged_kernel_check.py); without one it computes on the CPU as before.

Contract: `devices()` lists what the loaded libraries registered (a CPU build: the CPU only; a CUDA build:
CUDA0.. and the CPU); `Backend(name)` opens the named device ("CPU", "CUDA0"), or the first GPU for "gpu",
or raises `BackendUnavailable` naming what exists. Close a backend (or use it as a context manager).
"""

from __future__ import annotations

import ctypes
from dataclasses import dataclass
from functools import cache

from harness.kernels.ggml_fa import lib_dir, libs

# enum ggml_backend_dev_type (ggml-backend.h)
_DEVICE_KINDS = {0: "cpu", 1: "gpu", 2: "igpu", 3: "accel", 4: "meta"}


class BackendUnavailable(RuntimeError):
    """The device asked for is not in the loaded ggml libraries."""


@dataclass(frozen=True)
class Device:
    index: int
    name: str
    description: str
    kind: str  # cpu, gpu, igpu, accel, meta


@cache
def _registry() -> ctypes.CDLL:
    """libggml.so: the device registry (every backend built in registers there), after ggml_fa's base and CPU."""
    base, cpu = libs()
    reg = ctypes.CDLL(str(lib_dir() / "libggml.so"), mode=ctypes.RTLD_GLOBAL)
    p, size = ctypes.c_void_p, ctypes.c_size_t
    reg.ggml_backend_dev_count.argtypes, reg.ggml_backend_dev_count.restype = [], size
    reg.ggml_backend_dev_get.argtypes, reg.ggml_backend_dev_get.restype = [size], p
    for fn, args, res in (
            ("ggml_backend_dev_name", [p], ctypes.c_char_p),
            ("ggml_backend_dev_description", [p], ctypes.c_char_p),
            ("ggml_backend_dev_type", [p], ctypes.c_int),
            ("ggml_backend_dev_init", [p, ctypes.c_char_p], p),
            ("ggml_backend_free", [p], None),
            ("ggml_backend_alloc_ctx_tensors", [p, p], p),
            ("ggml_backend_buffer_free", [p], None),
            ("ggml_backend_tensor_set", [p, p, size, size], None),
            ("ggml_backend_tensor_get", [p, p, size, size], None),
            ("ggml_backend_graph_compute", [p, p], ctypes.c_int),
            ("ggml_backend_synchronize", [p], None),
            ("ggml_backend_supports_op", [p, p], ctypes.c_bool),
            ("ggml_tensor_overhead", [], size),
            ("ggml_graph_overhead", [], size)):
        f = getattr(base, fn)
        f.argtypes, f.restype = args, res
    cpu.ggml_backend_cpu_set_n_threads.argtypes = [p, ctypes.c_int]
    cpu.ggml_backend_cpu_set_n_threads.restype = None
    return reg


def devices() -> list[Device]:
    reg = _registry()
    base = libs()[0]
    out = []
    for i in range(reg.ggml_backend_dev_count()):
        dev = reg.ggml_backend_dev_get(i)
        out.append(Device(i, base.ggml_backend_dev_name(dev).decode(), base.ggml_backend_dev_description(dev).decode(),
                          _DEVICE_KINDS.get(base.ggml_backend_dev_type(dev), "other")))
    return out


class Backend:
    """A ggml backend (one stream) on a device: `handle` for the ggml calls; the CPU's runs `n_threads` threads."""

    def __init__(self, name: str = "CPU", n_threads: int = 2):
        found = devices()
        wanted = [d for d in found if (d.kind == "gpu" if name.lower() == "gpu" else d.name.lower() == name.lower())]
        if not wanted:
            raise BackendUnavailable(f"no ggml device {name!r} in {lib_dir()} (there are: "
                                     f"{', '.join(f'{d.name} ({d.kind})' for d in found) or 'none'})")
        self.device = wanted[0]
        base = libs()[0]
        self.handle = base.ggml_backend_dev_init(_registry().ggml_backend_dev_get(self.device.index), None)
        if not self.handle:
            raise BackendUnavailable(f"ggml could not open {self.device.name}")
        if self.device.kind == "cpu":
            libs()[1].ggml_backend_cpu_set_n_threads(self.handle, n_threads)

    def synchronize(self) -> None:
        libs()[0].ggml_backend_synchronize(self.handle)

    def close(self) -> None:
        if self.handle:
            libs()[0].ggml_backend_free(self.handle)
            self.handle = None

    def __enter__(self) -> Backend:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
