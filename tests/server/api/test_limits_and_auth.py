"""A second real server with one slot, a one-place queue and an API key."""

from __future__ import annotations

import threading

import httpx
import pytest

from tests.server.conftest import start_server, stop_server

pytestmark = pytest.mark.model
KEY = "sekret-key"
AUTH = {"Authorization": f"Bearer {KEY}"}


@pytest.fixture(scope="module")
def small_server(tmp_path_factory):
    server = start_server(tmp_path_factory.mktemp("small"), "--parallel", "1", "--max-queue", "1",
                          "--ctx-size", "1024", "--api-key", KEY, "--alias", "tiny",
                          "--strict-model-name")
    yield server
    stop_server(server)


def test_api_key_required_except_health(small_server):
    b = small_server.base_url
    assert httpx.get(b + "/health").status_code == 200
    r = httpx.get(b + "/v1/models")
    assert r.status_code == 401 and r.json()["error"]["code"] == "invalid_api_key"
    assert httpx.get(b + "/v1/models", headers={"Authorization": "Bearer wrong"}).status_code == 401
    r = httpx.get(b + "/v1/models", headers=AUTH)
    assert r.status_code == 200 and r.json()["data"][0]["id"] == "tiny"


def test_strict_model_name_rejects_other_names(small_server):
    url = small_server.v1 + "/chat/completions"
    body = {"messages": [{"role": "user", "content": "Hi"}], "max_tokens": 1}
    r = httpx.post(url, json={**body, "model": "gpt-4o-mini"}, headers=AUTH, timeout=60)
    assert r.status_code == 404 and r.json()["error"]["code"] == "model_not_found"
    r = httpx.post(url, json={**body, "model": "tiny"}, headers=AUTH, timeout=60)
    assert r.status_code == 200 and r.json()["model"] == "tiny"


def test_full_queue_answers_503_with_retry_after(small_server):
    url = small_server.v1 + "/chat/completions"
    body = {"messages": [{"role": "user", "content": "Tell me a story."}], "max_tokens": 20, "ignore_eos": True}
    results: list[int] = []

    def call():
        results.append(httpx.post(url, json=body, headers=AUTH, timeout=600).status_code)

    # The running request streams until the context is full and is cancelled by closing
    # its stream once the checks are done: a short one could end before the second
    # request is queued on a loaded machine, and the second would then never wait.
    long_body = {**body, "max_tokens": 900, "stream": True}
    with httpx.Client(timeout=600) as client, client.stream("POST", url, json=long_body, headers=AUTH) as running:
        assert running.status_code == 200
        _wait_until(lambda: _slots(small_server)[0]["is_processing"])
        queued = threading.Thread(target=call)
        queued.start()
        _wait_until(lambda: _metric(small_server, "llamacpp:requests_deferred") == 1.0)
        r = httpx.post(url, json=body, headers=AUTH, timeout=30)
        assert r.status_code == 503 and r.headers["retry-after"]
        assert r.json()["error"]["code"] == "queue_full"
    queued.join(600)
    assert results == [200]
    _wait_until(lambda: not _slots(small_server)[0]["is_processing"])


def _slots(server):
    return httpx.get(server.base_url + "/slots", headers=AUTH, timeout=30).json()


def _metric(server, name):
    for line in httpx.get(server.base_url + "/metrics", headers=AUTH).text.splitlines():
        if line.startswith(name + " "):
            return float(line.split()[-1])
    return None


def _wait_until(cond, timeout=30.0):
    import time

    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if cond():
            return
        time.sleep(0.05)
    raise AssertionError("condition not reached")
