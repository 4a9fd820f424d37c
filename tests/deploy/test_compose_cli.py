"""Renders every backend variant with Debian's docker-compose (v1) `config`: interpolation,
merging of the overlays and validation against the Compose file schema it ships.
Needs only the client (`apt-get install docker-compose`); no Docker engine.
"""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest
import yaml

from tests.deploy.deploy_files import ENV_EXAMPLE, REPO, SERVER_TARGETS, VARIANTS

COMPOSE = shutil.which("docker-compose")
pytestmark = pytest.mark.skipif(
    COMPOSE is None, reason="docker-compose (v1) is not installed: apt-get install docker-compose"
)


def config(files: list[str], env_file: Path, cwd: Path = REPO) -> subprocess.CompletedProcess:
    args = [COMPOSE, "--env-file", str(env_file)]
    for name in files:
        args += ["-f", name]
    return subprocess.run(args + ["config"], cwd=cwd, capture_output=True, text=True, timeout=120)


def env_with(tmp_path: Path, drop: set[str] = frozenset(), **overrides: str) -> Path:
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
def rendered() -> dict[str, dict]:
    out = {}
    for variant, files in VARIANTS.items():
        done = config(files, ENV_EXAMPLE)
        assert done.returncode == 0, f"{variant}: docker-compose config failed:\n{done.stderr}"
        out[variant] = yaml.safe_load(done.stdout)
    return out


@pytest.mark.parametrize("variant", sorted(VARIANTS))
def test_variant_renders_with_the_example_settings(rendered, variant):
    services = rendered[variant]["services"]
    assert services["server"]["build"]["target"] == SERVER_TARGETS[variant]
    assert services["server"]["image"] == f"arbor-server:{variant}"
    for name, service in services.items():
        for port in service["ports"]:
            assert str(port).startswith("127.0.0.1:"), f"{variant}/{name} publishes {port} beyond loopback"
    assert set(rendered[variant]["volumes"]) == {"arbor-cache", "arbor-data", "arbor-logs"}


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


def test_missing_model_file_is_refused_with_its_name(tmp_path):
    done = config(VARIANTS["cpu"], env_with(tmp_path, drop={"MODEL_FILE"}))
    assert done.returncode != 0
    assert "set MODEL_FILE in .env" in done.stderr


def test_cann_needs_the_device_group(tmp_path):
    done = config(VARIANTS["cann"], env_with(tmp_path, drop={"ASCEND_DEVICE_GID"}))
    assert done.returncode != 0
    assert "ASCEND_DEVICE_GID" in done.stderr


@pytest.mark.parametrize("variant", sorted(VARIANTS))
def test_compose_file_in_dotenv_selects_the_backend(tmp_path, variant):
    """The one setting: COMPOSE_FILE in .env, read by compose itself (no -f given)."""
    for name in {"compose.yaml", *VARIANTS[variant]}:
        shutil.copy(REPO / name, tmp_path / name)
    env_with(tmp_path, COMPOSE_FILE=":".join(VARIANTS[variant])).rename(tmp_path / ".env")
    done = subprocess.run([COMPOSE, "config"], cwd=tmp_path, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert yaml.safe_load(done.stdout)["services"]["server"]["build"]["target"] == SERVER_TARGETS[variant]


def test_bind_address_can_be_opened_deliberately(tmp_path):
    done = config(VARIANTS["cpu"], env_with(tmp_path, ARBOR_BIND_ADDRESS="0.0.0.0"))
    assert done.returncode == 0, done.stderr
    assert yaml.safe_load(done.stdout)["services"]["workbench"]["ports"][0].startswith("0.0.0.0:8090:")
