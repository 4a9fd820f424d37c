"""The switch of llama.cpp's paged-attention self-check (LLAMA_PAGED_ATTN_SELF_CHECK): off in a release build, on
wherever LLAMA_PAGED_ATTN_SELF_CHECK is a number other than 0, and what LlamaRuntime (and /props) reports of it. Each
case runs in a process of its own, since llama.cpp reads the variable when it makes the KV cache."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from tests.server.conftest import embedded_model_available

pytestmark = pytest.mark.model

SCRIPT = """
import json, sys
from server.engine.llama_runtime import BatchEntry, LlamaRuntime, RuntimeConfig
from server.model_file import embedded_model_path

rt = LlamaRuntime(RuntimeConfig(embedded_model_path(), n_ctx=512, n_batch=64, n_seq_max=2, n_threads=1,
                                n_threads_batch=1, paged_attn=sys.argv[1], page_size=16))
try:
    toks = rt.tokenize("one two three four five six seven eight", add_special=False, parse_special=False)
    for seq in (0, 1):  # a prompt each, then decodes side by side: paged masks of several sequences
        rt.decode([BatchEntry(t, i, seq, i == len(toks) - 1) for i, t in enumerate(toks)])
    for step in range(4):
        rt.decode([BatchEntry(toks[step], len(toks) + step, seq, True) for seq in (0, 1)])
    status = rt.paged_self_check()
    print(json.dumps(None if status is None else {"on": status.on, "failures": status.failures}))
finally:
    rt.close()
"""


def reported(paged: str, env_value: str | None) -> dict | None:
    env = {k: v for k, v in os.environ.items() if k != "LLAMA_PAGED_ATTN_SELF_CHECK"}
    if env_value is not None:
        env["LLAMA_PAGED_ATTN_SELF_CHECK"] = env_value
    done = subprocess.run([sys.executable, "-c", SCRIPT, paged], env=env, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


@pytest.fixture(autouse=True)
def _model():
    why = embedded_model_available()
    if why:
        pytest.skip(why)
    from server.engine import paged_attention

    if not paged_attention.compiled_in():
        pytest.skip("llama-cpp-python was not built from Arbor's patched source")


@pytest.mark.parametrize(("env_value", "on"), [(None, False), ("1", True), ("0", False), ("", False)])
def test_the_environment_turns_the_self_check_on(env_value, on):
    assert reported("on", env_value) == {"on": on, "failures": 0}


def test_nothing_is_reported_without_paged_attention():
    assert reported("off", "1") is None
