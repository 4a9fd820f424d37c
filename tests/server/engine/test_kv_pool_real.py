"""The unified KV pool on the real engine (issue 16): one request uses more than an even
share of the cells while the other slots idle; four long requests at once fit or queue,
and each runs to its full length — no 5xx, no early stop, KV consistent afterwards."""

from __future__ import annotations

import threading
import time
from concurrent.futures import ThreadPoolExecutor

import httpx
import pytest

from tests.server.api.test_openai_compat import idle_slots_consistent
from tests.server.conftest import start_server, stop_server

pytestmark = pytest.mark.model

CTX = 640  # 4 slots: an even share would be 160 cells


@pytest.fixture(scope="module")
def small_pool(tmp_path_factory):
    # llama.cpp checks every paged mask it builds, also while the pool is full. Here the idle slots' KV is
    # dropped whole, so no cell lands among another sequence's and nothing is defragmented (the counter stays 0);
    # test_defragment_real.py fills the pool so that it does, and checks the masks after the moves
    server = start_server(tmp_path_factory.mktemp("kvpool"), "--parallel", "4", "--ctx-size", str(CTX),
                          "--batch-size", "128", "--cache-tiers", "A", env={"LLAMA_PAGED_ATTN_SELF_CHECK": "1"})
    yield server
    stop_server(server)


TOPICS = ["Weather", "Rivers", "Engines", "Bridges", "Forests", "Harbors", "Glaciers", "Deserts", "Volcanoes",
          "Orchards"]


def _prompt(i: int, words: int) -> str:
    # distinct first words: no prompt shares a prefix with another, so a new request takes
    # an unused slot (least recently used) and the kept KV of finished ones stays put
    return f"{TOPICS[i]} report. " + " ".join(f"item{i}-{k}" for k in range(words))


def _complete(server, prompt: str, max_tokens: int) -> httpx.Response:
    body = {"prompt": prompt, "max_tokens": max_tokens, "temperature": 0, "ignore_eos": True}
    return httpx.post(server.v1 + "/completions", json=body, timeout=300)


def _metric(server, name: str) -> float:
    for line in httpx.get(server.base_url + "/metrics").text.splitlines():
        if line.startswith(name + " "):
            return float(line.split()[1])
    raise AssertionError(f"metric {name} missing")


def test_one_request_uses_more_than_an_even_share(small_pool):
    props = httpx.get(small_pool.base_url + "/props").json()
    assert props["default_generation_settings"]["n_ctx"] == CTX and props["n_ctx_slot"] == CTX
    r = _complete(small_pool, _prompt(0, 50), max_tokens=48)
    assert r.status_code == 200, r.text
    usage = r.json()["usage"]
    assert usage["prompt_tokens"] > CTX // 4 and usage["completion_tokens"] == 48
    slots = idle_slots_consistent(small_pool.base_url)
    assert max(s["n_past"] for s in slots) > CTX // 4  # one slot's KV holds more than its even share


def test_four_long_requests_fit_or_queue_and_each_runs_to_its_length(small_pool):
    # each reserves ~180 prompt + 60 output cells: two fit in 640 at once, two wait
    prompts = [_prompt(i + 1, 40) for i in range(4)]
    seen = {"busy": 0, "reserved": 0}
    done = threading.Event()

    def watch():
        while not done.is_set():
            slots = httpx.get(small_pool.base_url + "/slots", timeout=30).json()
            seen["busy"] = max(seen["busy"], sum(s["is_processing"] for s in slots))
            seen["reserved"] = max(seen["reserved"], sum(s["n_reserved"] for s in slots))
            time.sleep(0.1)

    watcher = threading.Thread(target=watch)
    watcher.start()
    try:
        with ThreadPoolExecutor(4) as pool:
            answers = list(pool.map(lambda p: _complete(small_pool, p, 60), prompts))
    finally:
        done.set()
        watcher.join()
    for r in answers:
        assert r.status_code == 200, r.text
        body = r.json()
        assert body["choices"][0]["finish_reason"] == "length" and body["usage"]["completion_tokens"] == 60
        assert body["usage"]["prompt_tokens"] > 150
    assert seen["busy"] == 2 and 0 < seen["reserved"] <= CTX  # the other two queued, none failed
    assert _metric(small_pool, "arbor:requests_preempted_total") == 0
    # the idle slots' kept KV filled the pool; later requests made room by dropping it
    assert _metric(small_pool, "arbor:kv_full_total") >= 1
    idle_slots_consistent(small_pool.base_url)
    paged = httpx.get(small_pool.base_url + "/props").json()["arbor"]["paged_attention"]
    assert paged["self_check"] == {"on": True, "failures": 0}, paged


def test_prompt_plus_max_tokens_beyond_the_context_is_a_400(small_pool):
    r = _complete(small_pool, _prompt(5, 60), max_tokens=CTX)
    assert r.status_code == 400 and r.json()["error"]["code"] == "context_length_exceeded"
