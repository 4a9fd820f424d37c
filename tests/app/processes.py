"""`arbor serve` as a process of its own, for the tests (and benchmarks) that run several
workbench processes on one database."""

from __future__ import annotations

import os
import subprocess
import sys
from contextlib import contextmanager
from pathlib import Path

from harness.serving.servers import free_port, wait_healthy
from tests.fakes.scripted_openai import MODEL_ID

ROOT = Path(__file__).resolve().parents[2]


@contextmanager
def workbench(tmp_path: Path, name: str, database_url: str, llm_base_url: str):
    """`arbor serve` as its own process on a free port; yields (base_url, process)."""
    port = free_port()
    env = {**os.environ, "DATABASE_URL": database_url, "LLM_BASE_URL": llm_base_url, "LLM_MODEL": MODEL_ID,
           "LLM_TIMEOUT_S": "60", "ARBOR_DATA_DIR": str(tmp_path / name)}
    log = tmp_path / f"{name}.log"
    proc = subprocess.Popen([sys.executable, "-m", "app", "serve", "--port", str(port)], cwd=ROOT, env=env,
                            stdout=log.open("w"), stderr=subprocess.STDOUT)
    url = f"http://127.0.0.1:{port}"
    try:
        wait_healthy(proc, url, 120, name, lambda: log.read_text(errors="replace")[-3000:], path="/healthz")
        yield url, proc
    finally:
        if proc.poll() is None:
            proc.terminate()
            try:
                proc.wait(timeout=20)
            except subprocess.TimeoutExpired:
                proc.kill()
