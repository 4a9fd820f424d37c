"""offload: the refusal without a device, llama.cpp's offload count, and the weight types that
fall back to the CPU, over inventories of the devices a CUDA, CANN or CPU host would show."""

from __future__ import annotations

import pytest

from server.engine.backend_devices import Backend, BackendDevice, Inventory
from server.engine.model_weights import WeightTensor
from server.engine.offload import NoAcceleratorError, check_devices, layers_offloaded, plan

CPU = BackendDevice(0, "CPU", "Intel Xeon", "cpu", "CPU", 0, 0)


def host(backend: str | None, *accelerators: str) -> Inventory:
    """An inventory with a CPU and, when `backend` is given, that backend and its devices."""
    devices = [BackendDevice(i, f"{backend}{i}", desc, "gpu", backend, 2**30, 2**31)
               for i, desc in enumerate(accelerators)]
    backends = [Backend(backend, len(devices))] if backend else []
    return Inventory((*backends, Backend("CPU", 1)), (*devices, CPU))


def blocks(*types: str) -> list[WeightTensor]:
    return [WeightTensor(f"blk.{i}.attn_q.weight", t) for i, t in enumerate(types)]


def test_layers_without_a_device_are_refused_naming_the_backend_that_opened_nothing():
    with pytest.raises(NoAcceleratorError) as err:
        check_devices(99, host("CUDA"), allow_cpu_fallback=False)
    msg = str(err.value)
    assert "--n-gpu-layers 99" in msg and "CUDA (0 devices)" in msg and "--allow-cpu-fallback" in msg


def test_a_cpu_only_build_is_named_as_such():
    with pytest.raises(NoAcceleratorError, match="no accelerator backend .only CPU.: build the CUDA or CANN"):
        check_devices(-1, host(None), allow_cpu_fallback=False)


def test_cpu_fallback_on_purpose_is_a_warning():
    warning = check_devices(20, host("CANN"), allow_cpu_fallback=True)
    assert "CANN (0 devices)" in warning and "as --allow-cpu-fallback allows" in warning


def test_nothing_to_check_without_layers_or_with_a_device():
    assert check_devices(0, host(None), allow_cpu_fallback=False) is None
    assert check_devices(99, host("CUDA", "NVIDIA H200"), allow_cpu_fallback=False) is None


@pytest.mark.parametrize("asked, accelerators, expected", [
    (99, 1, 31), (-1, 1, 31), (10, 1, 10), (31, 2, 31), (99, 0, 0), (0, 1, 0),
])
def test_layers_offloaded_as_llama_cpp_counts_them(asked, accelerators, expected):
    assert layers_offloaded(asked, 30, accelerators) == expected  # 30 blocks + the output layer


def test_cpu_fallback_reports_every_weight_type_on_the_cpu():
    report = plan(99, 30, host("CUDA"), blocks("Q4_K", "Q4_K", "Q6_K"))
    assert report.cpu_fallback and report.offloaded == 0 and report.devices == ()
    assert report.cpu_weight_types == {"Q4_K": 2, "Q6_K": 1}
    assert "0/31 layers on the CPU" in report.log_line() and "--allow-cpu-fallback" in report.log_line()
    assert report.weights_warning() is None


def test_a_cpu_deployment_has_nothing_falling_back():
    report = plan(0, 30, host(None), blocks("Q4_K"))
    assert not report.cpu_fallback and report.cpu_weight_types == {}
    assert report.log_line() == "offload: 0/31 layers on the CPU (--n-gpu-layers 0)"


def test_cann_910b_names_the_k_quants_it_cannot_multiply():
    report = plan(999, 30, host("CANN", "Ascend910B3"), blocks("Q4_K", "Q4_K", "Q6_K", "Q8_0"))
    assert report.offloaded == 31 and report.devices == ("CANN0 (Ascend910B3)",)
    assert report.cpu_weight_types == {"Q4_K": 2, "Q6_K": 1}
    warning = report.weights_warning()
    assert "CANN Ascend910B3 backend cannot multiply weights of type Q4_K (2 tensors), Q6_K (1 tensors)" in warning
    assert "F16, F32, Q4_0, Q8_0" in warning


def test_cann_support_follows_the_soc_the_backend_was_built_for():
    report = plan(999, 30, host("CANN", "Ascend910B3"), blocks("Q8_0"), build_soc="Ascend310P3")
    assert report.soc == "Ascend310P3" and report.cpu_weight_types == {"Q8_0": 1}
    assert any("built for Ascend310P3 but the device is Ascend910B3" in n for n in report.notes)


def test_cann_with_supported_types_warns_nothing():
    report = plan(999, 30, host("CANN", "Ascend910B3"), blocks("Q8_0", "F16"))
    assert report.cpu_weight_types == {} and report.weights_warning() is None and report.notes == ()


def test_a_backend_without_a_table_is_unknown_not_clean():
    report = plan(999, 30, host("Vulkan", "AMD"), blocks("Q4_K"))
    assert report.cpu_weight_types is None
    assert any("not known" in n for n in report.notes)
