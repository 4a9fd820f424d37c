"""The real backends of the workbench's end-to-end tests: arbor-server on the embedded model
and the simulated incident service, each a subprocess on a free loopback port."""

from __future__ import annotations

import contextlib
import os
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from tests.fakes.scripted_openai import free_port
from tests.server.conftest import embedded_model_available

ROOT = Path(__file__).resolve().parents[2]


def skip_reason() -> str | None:
    """Why the real backends cannot run here (None: they can); under CI a skip fails the run."""
    return embedded_model_available()


def _start(args: list[str], log: Path) -> subprocess.Popen:
    env = {**os.environ, "PYTHONPATH": str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", "")}
    handle = log.open("w")
    return subprocess.Popen([sys.executable, *args], cwd=ROOT, env=env, stdout=handle, stderr=subprocess.STDOUT)


def _wait_healthy(url: str, process: subprocess.Popen, log: Path, timeout_s: float) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if process.poll() is not None:
            pytest.fail(f"{url} exited with {process.returncode}:\n{log.read_text()[-3000:]}")
        try:
            if httpx.get(url, timeout=2).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        time.sleep(0.5)
    pytest.fail(f"{url} not healthy after {timeout_s:.0f} s:\n{log.read_text()[-3000:]}")


def _stop(process: subprocess.Popen) -> None:
    process.terminate()
    try:
        process.wait(timeout=20)
    except subprocess.TimeoutExpired:
        process.kill()
        process.wait(timeout=10)


@contextlib.contextmanager
def real_backends(logs: Path, server_args: list[str], incident: bool = True) -> Iterator[dict]:
    """Start arbor-server (`server_args` after the port) and, when asked, the incident service in
    state degraded; yields {"llm": <OpenAI base URL>, "incident": <URL or None>, "logs": logs}."""
    reason = skip_reason()
    if reason:
        pytest.skip(reason)
    llm_port, incident_port = free_port(), free_port()
    processes = [(_start(["-m", "server", "--port", str(llm_port), *server_args], logs / "server.log"),
                  f"http://127.0.0.1:{llm_port}/health", logs / "server.log", 300)]
    if incident:
        processes.insert(0, (_start(["-m", "scenarios.edge_incident.service", "--state", "degraded", "--host",
                                     "127.0.0.1", "--port", str(incident_port)], logs / "incident.log"),
                             f"http://127.0.0.1:{incident_port}/health", logs / "incident.log", 60))
    try:
        for process, health, log, timeout_s in processes:
            _wait_healthy(health, process, log, timeout_s)
        yield {"llm": f"http://127.0.0.1:{llm_port}/v1",
               "incident": f"http://127.0.0.1:{incident_port}" if incident else None, "logs": logs}
    finally:
        for process, *_ in processes:
            _stop(process)
