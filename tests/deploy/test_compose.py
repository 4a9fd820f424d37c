"""Structure of compose.yaml and its accelerator overlays, read as YAML (no Docker needed)."""

from __future__ import annotations

import re

import pytest

from tests.deploy.deploy_files import (
    ENV_EXAMPLE,
    SERVER_DOCKERFILES,
    SERVER_IMAGES,
    VARIANTS,
    env_example,
    load_compose,
)

BASE = load_compose("compose.yaml")
SERVICES = BASE["services"]
OVERLAYS = {"cuda": load_compose("compose.cuda.yaml"), "cann": load_compose("compose.cann.yaml"),
            "cann-2npu": load_compose("compose.cann-2npu.yaml")}
# the incident service answers /health with 503 in its simulated "failed" state, by design; /status is 200
HEALTH = {"server": (8080, "/health"), "workbench": (8090, "/healthz"), "incident-api": (8765, "/status")}


def flag(command: list[str], name: str) -> str:
    assert name in command, f"{name} missing from {command}"
    return command[command.index(name) + 1]


def mounts(service: dict) -> dict[str, str]:
    """container path -> source (named volume or host path) of short-syntax volumes."""
    out = {}
    for entry in service.get("volumes", []):
        assert isinstance(entry, str), f"use the short volume syntax: {entry}"
        parts = entry.split(":")
        if parts[-1] in ("ro", "rw"):
            parts.pop()
        out[parts[-1]] = ":".join(parts[:-1])  # sources like ${MODEL_DIR:?...} contain ':'
    return out


def test_the_three_services_exist():
    assert set(SERVICES) == {"server", "workbench", "incident-api"}
    for overlay in OVERLAYS.values():
        assert set(overlay["services"]) == {"server"}, "overlays only change the server"


def test_cpu_is_the_default_backend():
    assert SERVICES["server"]["build"]["dockerfile"] == SERVER_DOCKERFILES["cpu"]
    for name in ("workbench", "incident-api"):
        assert SERVICES[name]["build"]["dockerfile"] == "docker/workbench.Dockerfile"
    assert env_example()["COMPOSE_FILE"] == "compose.yaml"
    for variant in ("cuda", "cann"):
        server = OVERLAYS[variant]["services"]["server"]
        assert server["build"]["dockerfile"] == SERVER_DOCKERFILES[variant]
        assert server["image"] == SERVER_IMAGES[variant]
    for variant in set(VARIANTS) - {"cpu"}:
        assert f"#COMPOSE_FILE={':'.join(VARIANTS[variant])}" in ENV_EXAMPLE.read_text()


@pytest.mark.parametrize("name", sorted(HEALTH))
def test_every_service_has_a_healthcheck_on_its_endpoint(name):
    check = SERVICES[name]["healthcheck"]
    port, path = HEALTH[name]
    assert check["test"][0] == "CMD"
    assert f"http://127.0.0.1:{port}{path}" in " ".join(check["test"])
    assert {"interval", "timeout", "retries", "start_period"} <= set(check)


def test_workbench_waits_for_healthy_dependencies():
    depends = SERVICES["workbench"]["depends_on"]
    assert depends == {
        "server": {"condition": "service_healthy"},
        "incident-api": {"condition": "service_healthy"},
    }


@pytest.mark.parametrize("name", sorted(HEALTH))
def test_ports_are_published_on_loopback_by_default(name):
    """Each service has a bind address of its own (opening the workbench must not open the
    server: issue 35, item 3), loopback unless .env says otherwise."""
    port = HEALTH[name][0]
    (entry,) = SERVICES[name]["ports"]
    variable = {"server": "SERVER", "workbench": "WORKBENCH", "incident-api": "INCIDENT"}[name] + "_BIND_ADDRESS"
    assert re.fullmatch(r"\$\{%s:-127\.0\.0\.1\}:\$\{\w+_PORT:-%d\}:%d" % (variable, port, port), entry), entry  # noqa: UP031 - a regex full of braces
    assert env_example()[variable] == "127.0.0.1"


def test_services_listen_on_all_container_interfaces():
    assert flag(SERVICES["server"]["command"], "--host") == "0.0.0.0"
    assert flag(SERVICES["incident-api"]["command"], "--host") == "0.0.0.0"
    assert SERVICES["workbench"]["environment"]["ARBOR_HOST"] == "0.0.0.0"


def test_model_comes_from_env_and_is_mounted_read_only():
    server = SERVICES["server"]
    assert "${MODEL_DIR:?" in next(v for v in server["volumes"] if v.endswith(":/models:ro"))
    assert flag(server["command"], "--model").startswith("/models/${MODEL_FILE:?")
    assert flag(server["command"], "--alias") == "${MODEL_ALIAS:-local}"
    assert SERVICES["workbench"]["environment"]["LLM_MODEL"] == "${MODEL_ALIAS:-local}"


def test_named_volumes_for_cache_database_and_logs():
    volumes = BASE["volumes"]
    assert set(volumes) == {"arbor-cache", "arbor-data", "arbor-logs"}
    for name, spec in volumes.items():
        assert not (spec or {}).get("external"), f"{name} must be created (and kept) by compose"
    server, workbench = mounts(SERVICES["server"]), mounts(SERVICES["workbench"])
    cache_dir = flag(SERVICES["server"]["command"], "--cache-dir")
    assert server[cache_dir] == "arbor-cache"
    assert flag(SERVICES["server"]["command"], "--cache-tiers") == "${SERVER_CACHE_TIERS:-A,S,H,D}"
    data_dir = SERVICES["workbench"]["environment"]["ARBOR_DATA_DIR"]
    assert workbench[data_dir] == "arbor-data"
    for name in HEALTH:
        service = SERVICES[name]
        log_file = service["environment"]["ARBOR_LOG_FILE"]
        assert mounts(service)["/var/log/arbor"] == "arbor-logs" and log_file.startswith("/var/log/arbor/")


def test_no_anonymous_volumes():
    for name, service in SERVICES.items():
        for target, source in mounts(service).items():
            assert source.startswith(("arbor-", "${", "/")), f"{name}: {target} would be an anonymous volume"


def test_workbench_reaches_the_others_by_service_name():
    env = SERVICES["workbench"]["environment"]
    assert env["LLM_BASE_URL"] == "http://server:8080/v1"
    assert env["INCIDENT_BASE_URL"] == "http://incident-api:8765"


def test_cann_overlay_passes_devices_driver_and_group():
    server = OVERLAYS["cann"]["services"]["server"]
    devices = [d.split(":")[0] for d in server["devices"]]
    assert devices[0] == "${NPU_DEVICE"  # the NPU itself, /dev/davinciN
    assert {"/dev/davinci_manager", "/dev/devmm_svm", "/dev/hisi_hdc"} <= set(devices)
    assert "/dev/davinci0" in server["devices"][0]
    targets = mounts(server)
    assert targets["/usr/local/Ascend/driver"].startswith("${ASCEND_DRIVER_DIR")
    assert "/usr/local/bin/npu-smi" in targets and "/usr/local/dcmi" in targets
    assert all(v.endswith(":ro") for v in server["volumes"]), "host driver files are mounted read-only"
    assert server["group_add"] == ["${ASCEND_DEVICE_GID:?set ASCEND_DEVICE_GID in .env to the group id of "
                                   "/dev/davinci0 (stat -c %g /dev/davinci0)}"]
    assert set(server["build"]["args"]) == {"CANN_BASE_IMAGE", "CANN_ENV", "SOC_TYPE"}
    assert "ARBOR_SERVER_N_GPU_LAYERS" in server["environment"]


def test_second_npu_overlay_adds_one_required_device():
    """Atlas 300I Duo: both 310P chips; selected by COMPOSE_FILE, no file edited."""
    (device,) = OVERLAYS["cann-2npu"]["services"]["server"]["devices"]
    assert device.startswith("${NPU_DEVICE_2:?set NPU_DEVICE_2 in .env") and device.endswith(":${NPU_DEVICE_2}")
    assert set(OVERLAYS["cann-2npu"]["services"]["server"]) == {"devices"}


def test_cuda_overlay_reserves_an_nvidia_gpu():
    server = OVERLAYS["cuda"]["services"]["server"]
    (device,) = server["deploy"]["resources"]["reservations"]["devices"]
    assert device["driver"] == "nvidia"
    assert device["capabilities"] == ["gpu"]
    assert device["device_ids"] == ["${CUDA_DEVICE_ID:-0}"]
    assert server["build"]["args"]["CUDA_ARCHITECTURES"] == "${CUDA_ARCHITECTURES:-default}"
    assert "ARBOR_SERVER_N_GPU_LAYERS" in server["environment"]
    assert "devices" not in server


def test_no_secret_goes_into_an_image():
    """API keys only reach containers as run-time environment, never as build arguments."""
    for doc in [BASE, *OVERLAYS.values()]:
        for service in doc["services"].values():
            args = " ".join(f"{k}={v}" for k, v in (service.get("build") or {}).get("args", {}).items())
            assert not re.search(r"KEY|TOKEN|SECRET|PASSWORD", args, re.I), args
    assert SERVICES["server"]["environment"]["ARBOR_SERVER_API_KEY"] == "${ARBOR_API_KEY:-}"
    assert SERVICES["workbench"]["environment"]["LLM_API_KEY"].startswith("${ARBOR_API_KEY:-")
    assert "--api-key" not in SERVICES["server"]["command"], "a key on the command line shows in ps and inspect"
    assert env_example()["ARBOR_API_KEY"] == ""
