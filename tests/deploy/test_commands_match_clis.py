"""The commands and environments compose gives each service are accepted by the project's own
argument parsers and settings classes (with the .env.example values), so a renamed flag or
setting breaks this test instead of a deployment.
"""

from __future__ import annotations

import pytest

from app import settings as settings_module
from scenarios.edge_incident import service
from server import cli
from tests.deploy.deploy_files import env_example_filled, interpolate, load_compose

SERVICES = load_compose("compose.yaml")["services"]
OVERLAYS = {v: load_compose(f"compose.{v}.yaml")["services"]["server"] for v in ("cuda", "cann")}


def rendered_command(service: dict) -> list[str]:
    return [interpolate(str(part), env_example_filled()) for part in service["command"]]


def rendered_environment(service: dict) -> dict[str, str]:
    return {k: interpolate(str(v), env_example_filled()) for k, v in service.get("environment", {}).items()}


@pytest.mark.parametrize("variant", ["cpu", "cuda", "cann"])
def test_server_command_and_environment_build_valid_settings(variant, tmp_path, monkeypatch):
    command = rendered_command(SERVICES["server"])
    assert command[0] == "arbor-server"
    env = rendered_environment(SERVICES["server"])
    if variant != "cpu":
        env |= rendered_environment(OVERLAYS[variant])
    for key, value in env.items():
        if key.startswith("ARBOR_SERVER_"):
            monkeypatch.setenv(key, value)
    # The model directory is a host path; point --model at a real file to pass its check.
    model = tmp_path / "model.gguf"
    model.write_bytes(b"GGUF")
    args = command[1:]
    args[args.index("--model") + 1] = str(model)
    args[args.index("--cache-dir") + 1] = str(tmp_path / "cache")
    settings = cli.settings_from_args(args)
    assert settings.host == "0.0.0.0" and settings.port == 8080
    assert settings.alias == env_example_filled()["MODEL_ALIAS"]
    assert settings.cache_tiers == ("A", "S", "H", "D")
    assert not settings.api_key, "an empty ARBOR_API_KEY must mean no key"
    assert settings.n_gpu_layers == (0 if variant == "cpu" else 999)


def test_incident_command_is_accepted_by_its_parser():
    command = rendered_command(SERVICES["incident-api"])
    assert command[0] == "arbor-incident"
    args = service._parser().parse_args(command[1:])
    assert (args.state, args.host, args.port) == (env_example_filled()["INCIDENT_STATE"], "0.0.0.0", 8765)


def test_workbench_environment_builds_valid_settings(monkeypatch):
    monkeypatch.chdir("/")  # no developer .env is read
    for key, value in rendered_environment(SERVICES["workbench"]).items():
        if key != "ARBOR_LOG_FILE":
            monkeypatch.setenv(key, value)
    settings = settings_module.WorkbenchSettings()
    assert (settings.host, settings.port) == ("0.0.0.0", 8090)
    assert settings.llm_base_url == "http://server:8080/v1"
    assert settings.llm_model == env_example_filled()["MODEL_ALIAS"]
    assert settings.incident_base_url == "http://incident-api:8765"
    assert settings.database_url == "sqlite:////data/arbor.db"
