"""scripts/verify_deploy.sh against a fake `docker` CLI and real local HTTP health endpoints."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

from tests.deploy.deploy_files import VERIFY_SCRIPT

HERE = Path(__file__).parent
ENDPOINTS = {"incident-api": "/status", "server": "/health", "workbench": "/healthz"}


def offload_props(asked: int = 0, offloaded: int = 0, *, fallback: bool = False, cpu_types: dict | None = None,
                  devices: tuple[str, ...] = ()) -> dict:
    """The part of arbor-server's /props that the script reads (server/api/routes/info.py)."""
    return {"model_alias": "local", "arbor": {
        "devices": [{"index": 0, "name": "CPU", "kind": "cpu"}],
        "offload": {"n_gpu_layers": asked, "layers_offloaded": offloaded, "layers_total": 37,
                    "offload_devices": list(devices), "backend": None, "soc": None, "cpu_fallback": fallback,
                    "weight_types": {"Q4_K": 200}, "cpu_weight_types": cpu_types or {}, "needed_weight_types": [],
                    "warnings": []}}}


class HealthServer:
    """One local HTTP server per service: its health path with a set status, and (for the server)
    /props, which answers 401 without the right bearer key when `api_key` is set."""

    def __init__(self, path: str, status: int = 200):
        self.status = status
        self.props: dict | None = None
        self.api_key: str | None = None
        outer = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self):  # http.server's name
                if self.path == "/props" and outer.props is not None:
                    authorized = outer.api_key is None or self.headers.get("Authorization") == f"Bearer {outer.api_key}"
                    code, doc = (200, outer.props) if authorized else (401, {"error": "invalid api key"})
                else:
                    code = outer.status if self.path == path else 404
                    doc = {"status": "ok" if code == 200 else "loading"}
                body = json.dumps(doc, separators=(",", ":")).encode()  # compact, as FastAPI answers
                self.send_response(code)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, *args):
                pass

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.port = self.httpd.server_address[1]
        threading.Thread(target=self.httpd.serve_forever, daemon=True).start()

    def close(self):
        self.httpd.shutdown()
        self.httpd.server_close()


@pytest.fixture
def deployment(tmp_path):
    """A fake docker on PATH plus three live health endpoints; yields a runner."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    for engine in ("docker", "fakeengine"):  # fakeengine: an engine named only by ARBOR_COMPOSE
        fake = bin_dir / engine
        fake.write_text(f"#!/bin/sh\nFAKE_DOCKER_NAME={engine} exec {sys.executable} "
                        f"{HERE / 'fake_docker.py'} \"$@\"\n")
        fake.chmod(0o755)
    # records the limit the chat step runs under, then runs it
    (bin_dir / "timeout").write_text(f"#!/bin/sh\necho \"$1\" > {tmp_path / 'timeout_arg'}\nshift\nexec \"$@\"\n")
    (bin_dir / "timeout").chmod(0o755)
    servers = {name: HealthServer(path) for name, path in ENDPOINTS.items()}
    servers["server"].props = offload_props()
    scenario = {
        "services": {
            name: {"cid": f"cid-{name}", "states": ["running healthy"], "port": f"127.0.0.1:{srv.port}"}
            for name, srv in servers.items()
        },
        "exec_rc": 0,
    }

    class Deployment:
        def __init__(self):
            self.scenario = scenario
            self.servers = servers
            self.calls_file = tmp_path / "calls.jsonl"

            self.timeout_arg = tmp_path / "timeout_arg"
            self.cwd = tmp_path  # where a .env would be

        def run(self, *args: str, env: dict | None = None) -> subprocess.CompletedProcess:
            scenario_file = tmp_path / "scenario.json"
            scenario_file.write_text(json.dumps(self.scenario))
            full_env = {
                "PATH": f"{bin_dir}:{os.environ['PATH']}",
                "FAKE_DOCKER_SCENARIO": str(scenario_file),
                "FAKE_DOCKER_CALLS": str(self.calls_file),
                "ARBOR_VERIFY_POLL_S": "0.05",
                **(env or {}),
            }
            return subprocess.run([shutil.which("bash"), str(VERIFY_SCRIPT), *args], env=full_env, cwd=tmp_path,
                                  capture_output=True, text=True, timeout=120)

        def calls(self) -> list[list[str]]:
            return [json.loads(line) for line in self.calls_file.read_text().splitlines()]

    yield Deployment()
    for srv in servers.values():
        srv.close()


def test_all_healthy_then_runs_arbor_verify_in_the_workbench(deployment):
    done = deployment.run()
    assert done.returncode == 0, done.stderr
    for name in ENDPOINTS:
        assert f"ok: {name} is healthy" in done.stdout
        assert f"{ENDPOINTS[name]} -> " in done.stdout
    execs = [c[1:] for c in deployment.calls() if c[1:3] == ["compose", "exec"]]
    assert execs == [["compose", "exec", "-T", "workbench", "arbor", "verify",
                      "--base-url", "http://127.0.0.1:8090", "--chat"]]
    assert "ok: server runs on the CPU (--n-gpu-layers 0" in done.stdout
    assert done.stdout.rstrip().endswith("deployment verified")


def test_waits_while_a_service_is_starting(deployment):
    deployment.scenario["services"]["server"]["states"] = ["running starting"] * 3 + ["running healthy"]
    done = deployment.run()
    assert done.returncode == 0, done.stderr
    inspects = [c for c in deployment.calls() if c[1:2] == ["inspect"] and c[-1] == "cid-server"]
    assert len(inspects) == 4


def test_unhealthy_service_fails_with_its_health_output(deployment):
    service = deployment.scenario["services"]["server"]
    service["states"] = ["running unhealthy"]
    service["health_log"] = "urllib.error.HTTPError: HTTP Error 503: Service Unavailable"
    done = deployment.run()
    assert done.returncode == 1
    assert "FAIL: server is unhealthy" in done.stderr
    assert "HTTP Error 503" in done.stderr
    assert not [c for c in deployment.calls() if c[1:3] == ["compose", "exec"]]


def test_exited_container_fails(deployment):
    deployment.scenario["services"]["incident-api"]["states"] = ["exited none"]
    done = deployment.run()
    assert done.returncode == 1
    assert "incident-api: container is exited" in done.stderr


def test_missing_container_says_how_to_start(deployment):
    del deployment.scenario["services"]["workbench"]
    done = deployment.run()
    assert done.returncode == 1
    assert "workbench: no container" in done.stderr and "up -d" in done.stderr


def test_timeout_while_starting(deployment):
    deployment.scenario["services"]["server"]["states"] = ["running starting"]
    done = deployment.run("--timeout", "0")
    assert done.returncode == 1
    assert "server: still starting after 0s" in done.stderr


def test_failing_health_endpoint_fails_even_if_docker_says_healthy(deployment):
    deployment.servers["server"].status = 503
    done = deployment.run("--no-chat")
    assert done.returncode == 1
    assert "server: GET http://127.0.0.1:" in done.stderr


def test_failing_arbor_verify_fails_the_script(deployment):
    deployment.scenario["exec_rc"] = 3
    done = deployment.run()
    assert done.returncode == 1
    assert "arbor verify --chat failed" in done.stderr


def test_no_chat_skips_arbor_verify(deployment):
    done = deployment.run("--no-chat")
    assert done.returncode == 0, done.stderr
    assert not [c for c in deployment.calls() if c[1:3] == ["compose", "exec"]]


def test_bad_option_is_rejected(deployment):
    done = deployment.run("--bogus")
    assert done.returncode == 2
    assert "unknown option --bogus" in done.stderr


def test_offloaded_layers_are_reported(deployment):
    deployment.servers["server"].props = offload_props(999, 37, devices=("CUDA0 (NVIDIA H200)",))
    done = deployment.run("--no-chat")
    assert done.returncode == 0, done.stderr
    assert 'ok: server offloads 37/37 layers to ["CUDA0 (NVIDIA H200)"]' in done.stdout
    assert "WARN" not in done.stderr


def test_an_accelerator_deployment_running_on_the_cpu_fails(deployment):
    deployment.servers["server"].props = offload_props(999, 0, fallback=True)
    done = deployment.run()
    assert done.returncode == 1
    assert "server: --n-gpu-layers 999 but no layer is on a GPU/NPU (0/37 offloaded" in done.stderr
    assert not [c for c in deployment.calls() if c[1:3] == ["compose", "exec"]]


def test_weight_types_left_to_the_cpu_are_a_warning(deployment):
    deployment.servers["server"].props = offload_props(999, 37, devices=("CANN0 (Ascend910B3)",),
                                                       cpu_types={"Q4_K": 168, "Q6_K": 29})
    done = deployment.run("--no-chat")
    assert done.returncode == 0, done.stderr
    assert 'WARN: weight types the device cannot multiply run on the CPU: {"Q4_K":168,"Q6_K":29}' in done.stderr


def test_props_is_read_with_the_api_key_from_the_environment_or_dotenv(deployment):
    deployment.servers["server"].api_key = "s3cret"
    done = deployment.run("--no-chat")
    assert done.returncode == 1 and "server: GET http://127.0.0.1:" in done.stderr and "ARBOR_API_KEY" in done.stderr
    assert deployment.run("--no-chat", env={"ARBOR_API_KEY": "s3cret"}).returncode == 0
    (deployment.cwd / ".env").write_text("COMPOSE_FILE=compose.yaml\nARBOR_API_KEY=s3cret\n")
    assert deployment.run("--no-chat").returncode == 0


@pytest.mark.parametrize("tool", ["curl", "python3"])
def test_the_api_key_never_appears_on_a_command_line(deployment, tmp_path, tool):
    """The key travels to curl (or python's urllib, without curl) on stdin: a command line is
    readable by every user of the machine (ps). Both are wrapped to record their arguments; a key
    with a quote and a backslash shows the escaping of curl's config syntax holds."""
    key = 'k"e\\y s3cret'
    deployment.servers["server"].api_key = key
    argv_log = tmp_path / "argv.log"
    for name in ("curl", "python3"):
        # python3 on PATH may be a shim (pyenv) that needs a full PATH: this interpreter instead
        real = sys.executable if name == "python3" else shutil.which(name)
        wrapper = tmp_path / "bin" / name
        if name != tool or real is None:
            continue
        wrapper.write_text(f'#!/bin/sh\nprintf "%s\\n" "$*" >> {argv_log}\nexec {real} "$@"\n')
        wrapper.chmod(0o755)
    env = {"ARBOR_API_KEY": key}
    if tool == "python3":  # hide curl: a PATH of the fake bin, python's directory and the shell's tools
        no_curl = tmp_path / "nocurl"
        no_curl.mkdir()
        for name in ("sed", "grep", "head", "cut", "cat", "sleep", "env", "sh", "bash"):
            found = shutil.which(name)
            if found:
                (no_curl / name).symlink_to(found)
        (no_curl / "python3").symlink_to(tmp_path / "bin" / "python3")
        env["PATH"] = f"{tmp_path / 'bin'}:{no_curl}"
    done = deployment.run("--no-chat", env=env)
    assert done.returncode == 0, done.stderr
    assert "ok: server runs on the CPU" in done.stdout
    assert argv_log.exists() and "/props" in argv_log.read_text()  # the wrapped tool did the request
    assert "s3cret" not in argv_log.read_text()


def test_a_server_without_an_offload_report_fails(deployment):
    deployment.servers["server"].props = {"model_alias": "local"}
    done = deployment.run("--no-chat")
    assert done.returncode == 1 and "has no arbor.offload" in done.stderr


def test_arbor_compose_chooses_the_engine_for_every_call(deployment):
    done = deployment.run(env={"ARBOR_COMPOSE": "fakeengine compose"})
    assert done.returncode == 0, done.stderr
    engines = {c[0] for c in deployment.calls()}
    assert engines == {"fakeengine"}, "docker was called although ARBOR_COMPOSE names another engine"
    assert any(c[1:2] == ["inspect"] for c in deployment.calls())


def test_the_chat_step_runs_within_what_is_left_of_the_one_deadline(deployment):
    done = deployment.run("--timeout", "300")
    assert done.returncode == 0, done.stderr
    assert 1 <= int(deployment.timeout_arg.read_text()) <= 300


def test_the_fake_props_have_the_fields_the_real_server_reports():
    """The script reads these keys; server/api/routes/info.py must keep answering them."""
    pytest.importorskip("llama_cpp")
    from server.api.routes.info import _offload
    from server.engine.backend_devices import Inventory
    from server.engine.offload import plan

    real = _offload(plan(0, 36, Inventory((), ()), []))
    assert set(offload_props()["arbor"]["offload"]) == set(real)
