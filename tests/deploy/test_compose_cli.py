"""Renders every backend variant with Debian's docker-compose (v1) `config`: interpolation,
merging of the overlays and validation against the Compose file schema it ships.
Needs only the client (`apt-get install docker-compose`); no Docker engine.
"""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest
import yaml

from tests.deploy.deploy_files import ENV_EXAMPLE, REPO, REQUIRED_SAMPLES, SERVER_DOCKERFILES, SERVER_IMAGES, VARIANTS

COMPOSE = shutil.which("docker-compose")
pytestmark = pytest.mark.skipif(
    COMPOSE is None, reason="docker-compose (v1) is not installed: apt-get install docker-compose"
)


def config(files: list[str], env_file: Path, cwd: Path = REPO) -> subprocess.CompletedProcess:
    args = [COMPOSE, "--env-file", str(env_file)]
    for name in files:
        args += ["-f", name]
    # compose lets the process environment override the env file: the suite's own ARBOR_* settings
    # (tests/conftest.py) must not stand in for what the file under test leaves out
    env = {k: v for k, v in os.environ.items() if not k.startswith("ARBOR_")}
    return subprocess.run(args + ["config"], cwd=cwd, capture_output=True, text=True, timeout=120, env=env)


def env_with(tmp_path: Path, drop: set[str] = frozenset(), **overrides: str) -> Path:
    """.env.example with the required settings filled in (REQUIRED_SAMPLES), less `drop`, plus `overrides`."""
    overrides = {k: v for k, v in (REQUIRED_SAMPLES | overrides).items() if k not in drop}
    lines = []
    for line in ENV_EXAMPLE.read_text().splitlines():
        key = line.partition("=")[0]
        if key in drop or key in overrides:
            continue
        lines.append(line)
    lines += [f"{k}={v}" for k, v in overrides.items()]
    path = tmp_path / "test.env"
    path.write_text("\n".join(lines) + "\n")
    return path


@pytest.fixture(scope="module")
def rendered(tmp_path_factory) -> dict[str, dict]:
    env = env_with(tmp_path_factory.mktemp("env"))
    out = {}
    for variant, files in VARIANTS.items():
        done = config(files, env)
        assert done.returncode == 0, f"{variant}: docker-compose config failed:\n{done.stderr}"
        out[variant] = yaml.safe_load(done.stdout)
    return out


@pytest.mark.parametrize("variant", sorted(VARIANTS))
def test_variant_renders_with_the_example_settings(rendered, variant):
    services = rendered[variant]["services"]
    build = services["server"]["build"]
    assert build["dockerfile"] == SERVER_DOCKERFILES[variant] and "target" not in build
    assert services["server"]["image"] == SERVER_IMAGES[variant]
    for name, service in services.items():
        for port in service["ports"]:
            assert str(port).startswith("127.0.0.1:"), f"{variant}/{name} publishes {port} beyond loopback"
    cuda_cache = {"arbor-cuda-cache"} if variant == "cuda" else set()
    assert set(rendered[variant]["volumes"]) == {"arbor-cache", "arbor-data", "arbor-logs"} | cuda_cache
    environment = services["server"]["environment"]
    accelerated = variant != "cpu"
    assert (environment.get("ARBOR_SERVER_N_GPU_LAYERS"), environment.get("ARBOR_SERVER_ALLOW_CPU_FALLBACK")) == (
        ("999", "false") if accelerated else (None, None)), "an overlay refuses to run on the CPU unless told to"
    assert "BUILD_JOBS" in build["args"], "every server image's llama.cpp build takes BUILD_JOBS"


def test_cann_variant_has_devices_and_driver(rendered):
    server = rendered["cann"]["services"]["server"]
    assert "/dev/davinci0:/dev/davinci0" in server["devices"]
    assert "/usr/local/Ascend/driver:/usr/local/Ascend/driver:ro" in server["volumes"]
    assert server["environment"]["ARBOR_SERVER_N_GPU_LAYERS"] == "999"
    assert "devices" not in rendered["cpu"]["services"]["server"]


def test_cuda_variant_reserves_the_gpu(rendered):
    devices = rendered["cuda"]["services"]["server"]["deploy"]["resources"]["reservations"]["devices"]
    assert devices == [{"capabilities": ["gpu"], "device_ids": ["0"], "driver": "nvidia"}]
    assert "deploy" not in rendered["cpu"]["services"]["server"]


def test_cuda_variant_keeps_the_jit_cache_on_a_volume_and_takes_the_ubuntu_release(rendered):
    server = rendered["cuda"]["services"]["server"]
    cache = server["environment"]["CUDA_CACHE_PATH"]
    assert f"arbor-cuda-cache:{cache}:rw" in server["volumes"]
    assert server["build"]["args"]["CUDA_UBUNTU"] == "ubuntu24.04"
    assert "CUDA_CACHE_PATH" not in rendered["cpu"]["services"]["server"]["environment"]


def test_cuda_ubuntu_release_is_a_setting(tmp_path):
    done = config(VARIANTS["cuda"], env_with(tmp_path, CUDA_VERSION="12.2.2", CUDA_UBUNTU="ubuntu22.04"))
    assert done.returncode == 0, done.stderr
    args = yaml.safe_load(done.stdout)["services"]["server"]["build"]["args"]
    assert (args["CUDA_VERSION"], args["CUDA_UBUNTU"]) == ("12.2.2", "ubuntu22.04")


def test_the_example_as_copied_is_refused_until_the_model_is_set():
    done = config(VARIANTS["cpu"], ENV_EXAMPLE)
    assert done.returncode != 0
    assert "set MODEL_DIR in .env" in done.stderr or "set MODEL_FILE in .env" in done.stderr


def test_missing_model_file_is_refused_with_its_name(tmp_path):
    done = config(VARIANTS["cpu"], env_with(tmp_path, drop={"MODEL_FILE"}))
    assert done.returncode != 0
    assert "set MODEL_FILE in .env" in done.stderr


def test_cann_needs_the_device_group(tmp_path):
    """ASCEND_DEVICE_GID differs per host: the example leaves it empty, and compose says so."""
    done = config(VARIANTS["cann"], env_with(tmp_path, ASCEND_DEVICE_GID=""))
    assert done.returncode != 0
    assert "set ASCEND_DEVICE_GID in .env" in done.stderr


def test_second_npu_needs_its_device_and_adds_it(rendered, tmp_path):
    done = config(VARIANTS["cann-2npu"], env_with(tmp_path, drop={"NPU_DEVICE_2"}))
    assert done.returncode != 0
    assert "set NPU_DEVICE_2 in .env" in done.stderr
    devices = rendered["cann-2npu"]["services"]["server"]["devices"]
    assert {"/dev/davinci0:/dev/davinci0", "/dev/davinci1:/dev/davinci1",
            "/dev/davinci_manager:/dev/davinci_manager"} <= set(devices)
    assert len(devices) == len(rendered["cann"]["services"]["server"]["devices"]) + 1


def test_310p_is_chosen_by_settings_alone(tmp_path):
    """Base image and SoC of an Atlas 300I Duo through .env; the Dockerfile derives the rest."""
    image = "quay.io/ascend/cann:8.5.0-310p-ubuntu22.04-py3.11"
    done = config(VARIANTS["cann-2npu"], env_with(tmp_path, CANN_BASE_IMAGE=image, ASCEND_SOC_TYPE="Ascend310P3"))
    assert done.returncode == 0, done.stderr
    args = yaml.safe_load(done.stdout)["services"]["server"]["build"]["args"]
    assert (args["CANN_BASE_IMAGE"], args["SOC_TYPE"]) == (image, "Ascend310P3")


@pytest.mark.parametrize("variant", sorted(VARIANTS))
def test_compose_file_in_dotenv_selects_the_backend(tmp_path, variant):
    """The one setting: COMPOSE_FILE in .env, read by compose itself (no -f given)."""
    for name in {"compose.yaml", *VARIANTS[variant]}:
        shutil.copy(REPO / name, tmp_path / name)
    env_with(tmp_path, COMPOSE_FILE=":".join(VARIANTS[variant])).rename(tmp_path / ".env")
    done = subprocess.run([COMPOSE, "config"], cwd=tmp_path, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert yaml.safe_load(done.stdout)["services"]["server"]["build"]["dockerfile"] == SERVER_DOCKERFILES[variant]


def test_bind_address_can_be_opened_deliberately_one_service_at_a_time(tmp_path):
    done = config(VARIANTS["cpu"], env_with(tmp_path, WORKBENCH_BIND_ADDRESS="0.0.0.0"))
    assert done.returncode == 0, done.stderr
    services = yaml.safe_load(done.stdout)["services"]
    assert services["workbench"]["ports"][0].startswith("0.0.0.0:8090:")
    assert services["server"]["ports"][0].startswith("127.0.0.1:8080:")  # the server stays private
