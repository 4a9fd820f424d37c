"""Where the model's layers and matmuls run: the refusal to start without a device, and the
offload report that /props, --version's caller and the start-up log show.

llama.cpp never fails for want of a device: with `n_gpu_layers > 0` and no GPU it loads every
layer on the CPU, and a weight whose type the device cannot multiply quietly goes to a CPU
buffer. Both were invisible behind a healthy /health. This module turns them into facts.

Contract:
- `check_devices(n_gpu_layers, inventory, allow_cpu_fallback)` is called before the model
  loads. Layers asked for (`n_gpu_layers != 0`; -1 means all) and no accelerator device: it
  raises `NoAcceleratorError` whose message says which backends the build has and what to do,
  or, when `allow_cpu_fallback`, returns that message as a warning. Otherwise it returns None.
- `plan(...)` mirrors llama.cpp's own arithmetic (src/llama-model.cpp, load_tensors: the output
  layer counts as one more layer; `act_gpu_layers = devices.empty() ? 0 : min(n_gpu_layers,
  n_layer + 1)`) and, from the GGUF's weight types and `matmul_support`, names the types whose
  matmuls run on the CPU although layers were offloaded. It reads nothing itself.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from server.engine import matmul_support
from server.engine.backend_devices import Inventory
from server.engine.model_weights import WeightTensor, type_counts

FALLBACK_HINT = "start with --allow-cpu-fallback (ARBOR_SERVER_ALLOW_CPU_FALLBACK=true) to run on the CPU on purpose"


class NoAcceleratorError(RuntimeError):
    """Layers were asked for, no accelerator device is there, and CPU fallback was not allowed."""


def _no_device_reason(n_gpu_layers: int, inventory: Inventory) -> str:
    asked = "all layers" if n_gpu_layers < 0 else f"{n_gpu_layers} layers"
    head = (f"--n-gpu-layers {n_gpu_layers} asks for {asked} on an accelerator, but llama.cpp sees no GPU or NPU "
            "device. ")
    backends = inventory.accelerator_backends
    if backends:
        names = ", ".join(f"{b.name} ({b.n_devices} devices)" for b in backends)
        why = (f"This build has the {names} backend but it opened no device: the driver or the device could not "
               "be opened (llama.cpp's error is logged above: a driver older than the image's toolkit, a device "
               "not passed into the container, a wrong device group id, a device held by another process).")
    else:
        why = ("This llama.cpp build has no accelerator backend (only "
               f"{', '.join(b.name for b in inventory.backends) or 'nothing'}): build the CUDA or CANN server image.")
    return head + why


def check_devices(n_gpu_layers: int, inventory: Inventory, allow_cpu_fallback: bool) -> str | None:
    if n_gpu_layers == 0 or inventory.accelerators:
        return None
    reason = _no_device_reason(n_gpu_layers, inventory)
    if not allow_cpu_fallback:
        raise NoAcceleratorError(f"{reason} Fix that, or {FALLBACK_HINT}.")
    return f"{reason} Running on the CPU, as --allow-cpu-fallback allows."


def layers_offloaded(n_gpu_layers: int, n_layer: int, n_accelerators: int) -> int:
    """llama.cpp's count of offloaded layers (out of n_layer + 1: the output layer counts)."""
    if n_accelerators == 0:
        return 0
    asked = n_gpu_layers if n_gpu_layers >= 0 else n_layer + 1
    return min(asked, n_layer + 1)


@dataclass(frozen=True)
class OffloadReport:
    """What runs where, for /props and the start-up log.

    `cpu_weight_types` (type -> tensors) are the matmul weights meant for an accelerator that
    run on the CPU: every type when layers were asked for and no device is there; the types the
    device's backend cannot multiply otherwise; empty when no layer was asked for; None when
    that cannot be known (a backend `matmul_support` has no table for)."""

    n_gpu_layers: int  # as asked (-1: all)
    n_layer: int
    offloaded: int  # of n_layer + 1
    devices: tuple[str, ...]  # the accelerators layers go to: "CUDA0 (NVIDIA H200)"
    backend: str | None  # their backend ("CUDA", "CANN"), None without one
    soc: str | None  # CANN: the SoC whose support table applies
    weight_types: dict[str, int]  # every matmul weight type of the model
    cpu_weight_types: dict[str, int] | None
    needed_types: tuple[str, ...] = ()  # what the backend multiplies, when some types are not among them
    notes: tuple[str, ...] = field(default=())

    @property
    def offloadable(self) -> int:
        return self.n_layer + 1

    @property
    def cpu_fallback(self) -> bool:
        """Layers were asked for and none run on an accelerator."""
        return self.n_gpu_layers != 0 and self.offloaded == 0

    def log_line(self) -> str:
        where = f"on {', '.join(self.devices)}" if self.offloaded else "on the CPU"
        line = f"offload: {self.offloaded}/{self.offloadable} layers {where} (--n-gpu-layers {self.n_gpu_layers})"
        if self.cpu_fallback:
            line += ": no accelerator device, CPU fallback allowed by --allow-cpu-fallback"
        return line

    def weights_warning(self) -> str | None:
        """The message that names the weight types an accelerator cannot multiply, or None."""
        if not self.offloaded or not self.cpu_weight_types:
            return None
        types = ", ".join(f"{t} ({n} tensors)" for t, n in self.cpu_weight_types.items())
        chip = f" {self.soc}" if self.soc else ""
        return (f"the {self.backend}{chip} backend cannot multiply weights of type {types}: those matmuls run on the "
                f"CPU. It multiplies {', '.join(self.needed_types)}: use a GGUF with those types (docs/deploy.md).")


def plan(n_gpu_layers: int, n_layer: int, inventory: Inventory, weights: list[WeightTensor],
         build_soc: str | None = None) -> OffloadReport:
    """`build_soc`: the SoC the CANN backend was compiled for, when the image records it
    (ARBOR_CANN_SOC_TYPE); the device's own SoC name otherwise."""
    accel = inventory.accelerators
    offloaded = layers_offloaded(n_gpu_layers, n_layer, len(accel))
    backend = accel[0].backend if accel else None
    soc, notes = None, []
    if backend == "CANN":
        device_soc = accel[0].description
        soc = build_soc or device_soc
        if build_soc and matmul_support.cann_family(build_soc) != matmul_support.cann_family(device_soc):
            notes.append(f"the CANN backend was built for {build_soc} but the device is {device_soc}: rebuild with "
                         f"ASCEND_SOC_TYPE={device_soc}")
    all_types = type_counts(weights)
    if n_gpu_layers == 0:
        cpu_types: dict[str, int] | None = {}
    elif not offloaded:
        cpu_types = all_types
    else:
        assert backend is not None  # offloaded: there is an accelerator
        cpu_types = matmul_support.unsupported(backend, soc, weights)
        if cpu_types is None:
            notes.append(f"which weight types the {backend} backend multiplies is not known to arbor-server")
    needed = tuple(matmul_support.needed_types(backend, soc)) if offloaded and backend and cpu_types else ()
    return OffloadReport(
        n_gpu_layers=n_gpu_layers, n_layer=n_layer, offloaded=offloaded,
        devices=tuple(f"{d.name} ({d.description})" for d in accel) if offloaded else (),
        backend=backend, soc=soc, weight_types=all_types, cpu_weight_types=cpu_types, needed_types=needed,
        notes=tuple(notes),
    )
