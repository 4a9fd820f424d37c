"""The real arbor-server on this CPU (no GPU or NPU): --n-gpu-layers without a device refuses to
start, --allow-cpu-fallback starts and says so in the log and /props, and a plain CPU server
reports its offload too (issue 25)."""

from __future__ import annotations

import subprocess
import sys

import httpx
import pytest

from server.engine.backend_devices import inventory
from tests.server.conftest import ROOT, embedded_model_available, free_port, start_server, stop_server

pytestmark = pytest.mark.model


@pytest.fixture(autouse=True)
def _no_accelerator_here():
    why = embedded_model_available()
    if why:
        pytest.skip(why)
    if inventory().accelerators:
        pytest.skip("this machine has a GPU/NPU: the refusal needs a host without one")


def test_layers_without_a_device_refuse_to_start():
    port = free_port()
    done = subprocess.run([sys.executable, "-m", "server", "--port", str(port), "--n-gpu-layers", "99"],
                          cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert done.returncode == 2, done.stdout + done.stderr
    assert ("--n-gpu-layers 99 asks for 99 layers on an accelerator, but llama.cpp sees no GPU or NPU device"
            in done.stderr)
    assert "--allow-cpu-fallback" in done.stderr
    assert "Uvicorn running" not in done.stdout + done.stderr  # refused before listening


def test_cpu_fallback_on_purpose_starts_and_reports_it(tmp_path):
    server = start_server(tmp_path, "--n-gpu-layers", "99", "--allow-cpu-fallback", "--parallel", "1",
                          "--ctx-size", "1024")
    try:
        arbor = httpx.get(server.base_url + "/props", timeout=30).json()["arbor"]
        log = server.log()
    finally:
        stop_server(server)
    offload = arbor["offload"]
    assert [d["kind"] for d in arbor["devices"]] == ["cpu"]
    assert offload["cpu_fallback"] is True and offload["layers_offloaded"] == 0 and offload["offload_devices"] == []
    assert offload["n_gpu_layers"] == 99 and offload["layers_total"] == 31  # SmolLM2: 30 blocks + output
    # every matmul weight of the embedded Q4_1 model (tied embeddings: the Q8_0 token embedding too)
    assert offload["cpu_weight_types"] == offload["weight_types"] == {"Q4_1": 210, "Q8_0": 1}
    assert "offload: 0/31 layers on the CPU (--n-gpu-layers 99): no accelerator device" in log
    assert "Running on the CPU, as --allow-cpu-fallback allows" in log
    assert arbor["paged_attention"]["enabled"], "no layer is offloaded, so auto paged attention stays on"


def test_a_cpu_server_reports_nothing_falling_back(arbor_server):
    offload = httpx.get(arbor_server.base_url + "/props", timeout=30).json()["arbor"]["offload"]
    assert offload["n_gpu_layers"] == 0 and offload["cpu_fallback"] is False
    assert offload["cpu_weight_types"] == {} and offload["warnings"] == []
    assert "offload: 0/31 layers on the CPU (--n-gpu-layers 0)" in arbor_server.log()
