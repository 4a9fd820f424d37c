"""The backends and devices llama.cpp sees (ggml's backend registry), read through ctypes.

llama-cpp-python 0.3.36 binds none of ggml's backend-registry functions, so they are declared
here on the libllama that llama_cpp already loaded (`llama_backend.c_functions`): this reads the
very registry llama.cpp picks its devices from, wherever LLAMA_CPP_LIB_PATH pointed the bindings.

Contract:
- `inventory()` returns every registered backend (its name and how many devices it found) and
  every device in ggml's order, which is the order llama.cpp assigns layers in. It initialises
  llama.cpp's backend (`llama_backend.init_once`) and loads no model. It raises
  `BackendProbeError` only when the library lacks the registry functions.
- A backend that is compiled in but could not open its driver (a CUDA driver older than the
  toolkit, an Ascend device node the process may not open, a busy NPU) is listed with 0
  devices: ggml logs one line and carries on, which is why this module exists.
- `BackendDevice.is_accelerator` is what llama.cpp offloads layers to: GPU and integrated GPU
  devices (src/llama.cpp, llama_prepare_model_devices); not the CPU, and not ACCEL devices
  (BLAS, AMX), which only help the CPU backend.
"""

from __future__ import annotations

import ctypes
from dataclasses import dataclass
from functools import cache
from typing import Any

from server.engine.llama_backend import MissingSymbol, c_functions, init_once

# enum ggml_backend_dev_type (ggml/include/ggml-backend.h, in this order)
_DEVICE_KINDS = ("cpu", "gpu", "igpu", "accel", "meta")
ACCELERATOR_KINDS = frozenset({"gpu", "igpu"})


class BackendProbeError(RuntimeError):
    """The loaded llama.cpp library does not export ggml's backend registry."""


@dataclass(frozen=True)
class Backend:
    """One registered ggml backend ("CPU", "CUDA", "CANN", ...) and how many devices it opened."""

    name: str
    n_devices: int


@dataclass(frozen=True)
class BackendDevice:
    """One device as ggml reports it; memory in bytes (free as of the probe)."""

    index: int
    name: str  # e.g. "CUDA0", "CANN0", "CPU"
    description: str  # e.g. "NVIDIA H200", "Ascend910B3" (CANN reports the SoC name here)
    kind: str  # one of _DEVICE_KINDS, or "unknown"
    backend: str  # the registry entry it belongs to
    memory_free: int
    memory_total: int

    @property
    def is_accelerator(self) -> bool:
        return self.kind in ACCELERATOR_KINDS


@dataclass(frozen=True)
class Inventory:
    """Everything ggml registered in this process."""

    backends: tuple[Backend, ...]
    devices: tuple[BackendDevice, ...]

    @property
    def accelerators(self) -> tuple[BackendDevice, ...]:
        return tuple(d for d in self.devices if d.is_accelerator)

    @property
    def accelerator_backends(self) -> tuple[Backend, ...]:
        """Compiled-in backends other than the CPU ones (BLAS and friends report no GPU devices
        but are not accelerators llama.cpp offloads to either; they are kept: the caller says
        what a backend with 0 devices means)."""
        return tuple(b for b in self.backends if b.name not in ("CPU", "BLAS", "RPC"))

    def lines(self) -> list[str]:
        """Human-readable lines: one per backend, one per device (for --version and logs)."""
        out = ["backends: " + ", ".join(f"{b.name} ({b.n_devices} device{'s' * (b.n_devices != 1)})"
                                        for b in self.backends)]
        for d in self.devices:
            mem = f", {d.memory_free / 2**30:.1f}/{d.memory_total / 2**30:.1f} GiB free" if d.memory_total else ""
            out.append(f"device {d.index}: {d.name} ({d.description}), {d.kind}, backend {d.backend}{mem}")
        accel = ", ".join(d.name for d in self.accelerators)
        out.append(f"accelerators: {accel or 'none (layers asked with --n-gpu-layers cannot be offloaded here)'}")
        return out


_SIGNATURES: dict[str, tuple[list[Any], Any]] = {
    "ggml_backend_reg_count": ([], ctypes.c_size_t),
    "ggml_backend_reg_get": ([ctypes.c_size_t], ctypes.c_void_p),
    "ggml_backend_reg_name": ([ctypes.c_void_p], ctypes.c_char_p),
    "ggml_backend_reg_dev_count": ([ctypes.c_void_p], ctypes.c_size_t),
    "ggml_backend_dev_count": ([], ctypes.c_size_t),
    "ggml_backend_dev_get": ([ctypes.c_size_t], ctypes.c_void_p),
    "ggml_backend_dev_name": ([ctypes.c_void_p], ctypes.c_char_p),
    "ggml_backend_dev_description": ([ctypes.c_void_p], ctypes.c_char_p),
    "ggml_backend_dev_type": ([ctypes.c_void_p], ctypes.c_int),
    "ggml_backend_dev_backend_reg": ([ctypes.c_void_p], ctypes.c_void_p),
    "ggml_backend_dev_memory": ([ctypes.c_void_p, ctypes.POINTER(ctypes.c_size_t), ctypes.POINTER(ctypes.c_size_t)],
                                None),
}


@cache
def _lib():
    try:
        return c_functions(_SIGNATURES)
    except MissingSymbol as exc:
        raise BackendProbeError(f"{exc} (ggml's backend registry)") from exc


def _text(ptr: bytes | None) -> str:
    return ptr.decode("utf-8", errors="replace") if ptr else ""


def inventory() -> Inventory:
    init_once()
    lib = _lib()
    backends = []
    for i in range(lib.ggml_backend_reg_count()):
        reg = lib.ggml_backend_reg_get(i)
        backends.append(Backend(_text(lib.ggml_backend_reg_name(reg)), int(lib.ggml_backend_reg_dev_count(reg))))
    devices = []
    for i in range(lib.ggml_backend_dev_count()):
        dev = lib.ggml_backend_dev_get(i)
        free, total = ctypes.c_size_t(0), ctypes.c_size_t(0)
        lib.ggml_backend_dev_memory(dev, ctypes.byref(free), ctypes.byref(total))
        kind = lib.ggml_backend_dev_type(dev)
        devices.append(BackendDevice(
            index=i, name=_text(lib.ggml_backend_dev_name(dev)),
            description=_text(lib.ggml_backend_dev_description(dev)),
            kind=_DEVICE_KINDS[kind] if 0 <= kind < len(_DEVICE_KINDS) else "unknown",
            backend=_text(lib.ggml_backend_reg_name(lib.ggml_backend_dev_backend_reg(dev))),
            memory_free=int(free.value), memory_total=int(total.value),
        ))
    return Inventory(tuple(backends), tuple(devices))
