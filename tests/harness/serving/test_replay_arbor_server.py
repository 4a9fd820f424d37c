"""Replay a generated agent workload against the real arbor-server on the embedded model.

Checks what must hold on any correct server: every request answers with usage, the ideal
is computed on the server's own tokens and agrees with its usage counts, and no cache
computes fewer prompt tokens than the ideal allows (see the slack below).
"""

import importlib.util
import socket
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest

from harness.serving.runner import ReplaySettings, replay
from harness.workloads.generators import agent_sessions
from tests.cores import model_threads

ROOT = Path(__file__).resolve().parents[3]

pytestmark = [
    pytest.mark.model,
    pytest.mark.skipif(importlib.util.find_spec("llama_cpp") is None,
                       reason="llama-cpp-python is not importable (still being built?)"),
]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def arbor_server(tmp_path_factory):
    port = _free_port()
    log = tmp_path_factory.mktemp("arbor-server") / "server.log"
    with log.open("w") as out:
        proc = subprocess.Popen([sys.executable, "-m", "server", "--port", str(port), "--threads", str(model_threads()),
                                 "--parallel", "2", "--ctx-size", "4096"],
                                cwd=ROOT, stdout=out, stderr=subprocess.STDOUT)
    base = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 180
        while True:
            if proc.poll() is not None:
                pytest.fail(f"arbor-server exited with {proc.returncode}:\n{log.read_text()[-3000:]}")
            try:
                if httpx.get(base + "/health", timeout=2).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            if time.monotonic() > deadline:
                pytest.fail(f"arbor-server did not become healthy:\n{log.read_text()[-3000:]}")
            time.sleep(0.5)
        yield base
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


async def test_agent_workload_against_arbor_server(arbor_server):
    workload = agent_sessions(scenario="edge_incident", sessions=2, turns=3, system_len=120, user_len=15,
                              tool_result_len=40, tool_call_len=8, output_len=8)
    result = await replay(workload.lines, ReplaySettings(base_url=arbor_server, concurrency=2, progress=False,
                                                         force_output_length=True, ideal="server"))
    errors = [r.error for r in result.requests if not r.ok]
    assert not errors, errors
    assert all(r.prompt_tokens and r.ttft_s is not None and r.ttft_s <= r.latency_s for r in result.requests)
    assert all(r.completion_tokens == 8 for r in result.requests)
    s = result.summary
    ideal = s["ideal"]
    assert ideal["unit"] == "tokens" and ideal["prompt_token_mismatches"] == 0
    # The ideal counts prefixes of earlier *prompts*; a slot that keeps its generated tokens (source A)
    # may also reuse the first tokens of a recorded assistant turn when the model happened to generate
    # them, so each request may beat it by at most its predecessor's output length.
    slack = sum(r.completion_tokens for r in result.requests)
    assert ideal["ideal_computed_tokens"] - slack <= s["tokens"]["computed"] <= s["tokens"]["prompt"]
    assert s["tokens"]["cached"] > 0  # later turns extend earlier ones: some prefix is reused
