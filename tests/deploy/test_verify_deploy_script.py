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
ENDPOINTS = {"incident-api": "/status", "server": "/health", "workbench": "/api/health"}


class HealthServer:
    """One local HTTP server per service; answers its health path with a set status."""

    def __init__(self, path: str, status: int = 200):
        self.status = status
        outer = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self):  # noqa: N802 (http.server's name)
                code = outer.status if self.path == path else 404
                body = json.dumps({"status": "ok" if code == 200 else "loading"}).encode()
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
    docker = bin_dir / "docker"
    docker.write_text(f"#!/bin/sh\nexec {sys.executable} {HERE / 'fake_docker.py'} \"$@\"\n")
    docker.chmod(0o755)
    servers = {name: HealthServer(path) for name, path in ENDPOINTS.items()}
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

        def run(self, *args: str) -> subprocess.CompletedProcess:
            scenario_file = tmp_path / "scenario.json"
            scenario_file.write_text(json.dumps(self.scenario))
            env = {
                "PATH": f"{bin_dir}:{os.environ['PATH']}",
                "FAKE_DOCKER_SCENARIO": str(scenario_file),
                "FAKE_DOCKER_CALLS": str(self.calls_file),
                "ARBOR_VERIFY_POLL_S": "0.05",
            }
            return subprocess.run([shutil.which("bash"), str(VERIFY_SCRIPT), *args], env=env,
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
    execs = [c for c in deployment.calls() if c[:2] == ["compose", "exec"]]
    assert execs == [["compose", "exec", "-T", "workbench", "arbor", "verify",
                      "--base-url", "http://127.0.0.1:8090", "--chat"]]
    assert done.stdout.rstrip().endswith("deployment verified")


def test_waits_while_a_service_is_starting(deployment):
    deployment.scenario["services"]["server"]["states"] = ["running starting"] * 3 + ["running healthy"]
    done = deployment.run()
    assert done.returncode == 0, done.stderr
    inspects = [c for c in deployment.calls() if c[:1] == ["inspect"] and c[-1] == "cid-server"]
    assert len(inspects) == 4


def test_unhealthy_service_fails_with_its_health_output(deployment):
    service = deployment.scenario["services"]["server"]
    service["states"] = ["running unhealthy"]
    service["health_log"] = "urllib.error.HTTPError: HTTP Error 503: Service Unavailable"
    done = deployment.run()
    assert done.returncode == 1
    assert "FAIL: server is unhealthy" in done.stderr
    assert "HTTP Error 503" in done.stderr
    assert not [c for c in deployment.calls() if c[:2] == ["compose", "exec"]]


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
    assert not [c for c in deployment.calls() if c[:2] == ["compose", "exec"]]


def test_bad_option_is_rejected(deployment):
    done = deployment.run("--bogus")
    assert done.returncode == 2
    assert "unknown option --bogus" in done.stderr
