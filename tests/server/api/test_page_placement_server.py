"""arbor-server's pages owned by one sequence (--page-placement owned, the default; native/src/llama-kv-pages.cpp
through the server):
/props reports the placement in force, and two requests decoding side by side in pages of their own pass
llama.cpp's self-check of every paged mask (LLAMA_PAGED_ATTN_SELF_CHECK=1: with only the CPU kernel reading the
mask, what it must not read is NaN, so a wrong page would show as a failed check or as no answer)."""

from __future__ import annotations

import concurrent.futures

import httpx
import pytest

from tests.server.conftest import start_server, stop_server

pytestmark = pytest.mark.model


def chat(base: str, text: str) -> str:
    body = {"messages": [{"role": "user", "content": text}], "max_tokens": 12, "temperature": 0}
    r = httpx.post(base + "/v1/chat/completions", json=body, timeout=120)
    assert r.status_code == 200, r.text
    return r.json()["choices"][0]["message"]["content"]


def test_owned_pages_in_the_server(tmp_path):
    server = start_server(tmp_path, "--parallel", "2", "--ctx-size", "2048", "--batch-size", "64",
                          "--no-cache", env={"LLAMA_PAGED_ATTN_SELF_CHECK": "1"})
    try:
        paged = httpx.get(server.base_url + "/props").json()["arbor"]["paged_attention"]
        if not paged["compiled_in"]:
            pytest.skip("llama-cpp-python was not built from Arbor's patched source")
        assert paged["enabled"] and paged["placement"] == "owned"
        prompts = ["Name three colours of the sea.", "Say what a pump does, in one line."]
        alone = [chat(server.base_url, p) for p in prompts]
        with concurrent.futures.ThreadPoolExecutor(2) as pool:
            together = list(pool.map(lambda p: chat(server.base_url, p), prompts))
        paged = httpx.get(server.base_url + "/props").json()["arbor"]["paged_attention"]
        assert paged["self_check"] == {"on": True, "failures": 0}
        assert all(alone) and all(together)
    finally:
        stop_server(server)
