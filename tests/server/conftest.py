"""Fixtures that start the real arbor-server (embedded model) on a free loopback port."""

from __future__ import annotations

import os
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest

from harness.serving import servers as bench_servers
from tests.cores import model_threads

ROOT = Path(__file__).resolve().parents[2]


free_port = bench_servers.free_port


def embedded_model_available() -> str | None:
    """None when the real engine can run here, else the reason it cannot."""
    try:
        import llama_cpp  # noqa: F401
    except ImportError:
        return "llama-cpp-python is not installed (run scripts/setup.sh)"
    from server.model_file import EmbeddedModelMissing, embedded_model_path

    try:
        embedded_model_path()
    except EmbeddedModelMissing as exc:
        return str(exc)
    return None


@dataclass
class RunningServer:
    base_url: str
    proc: subprocess.Popen
    log_path: Path

    @property
    def v1(self) -> str:
        return self.base_url + "/v1"

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")


def start_server(tmp_dir: Path, *args: str, env: dict | None = None, wait: bool = True) -> RunningServer:
    why = embedded_model_available()
    if why:
        pytest.skip(why)
    port = free_port()
    log_path = tmp_dir / f"server-{port}.log"
    cmd = [sys.executable, "-m", "server", "--port", str(port), "--threads", str(model_threads()), *args]
    proc = subprocess.Popen(cmd, cwd=ROOT, stdout=log_path.open("w"), stderr=subprocess.STDOUT,
                            env={**os.environ, **(env or {})})
    server = RunningServer(f"http://127.0.0.1:{port}", proc, log_path)
    if wait:
        wait_healthy(server)
    return server


def wait_healthy(server: RunningServer, timeout: float = 120.0) -> None:
    bench_servers.wait_healthy(server.proc, server.base_url, timeout, "arbor-server", server.log)


def stop_server(server: RunningServer) -> None:
    server.proc.terminate()
    try:
        server.proc.wait(timeout=20)
    except subprocess.TimeoutExpired:
        server.proc.kill()
        server.proc.wait()


@pytest.fixture(scope="session")
def arbor_server(tmp_path_factory) -> RunningServer:
    """One shared server: 2 slots, 2048 cells each, small batch so chunking shows."""
    server = start_server(tmp_path_factory.mktemp("arbor"), "--parallel", "2", "--ctx-size", "4096",
                          "--batch-size", "64", "--max-queue", "4")
    yield server
    stop_server(server)
