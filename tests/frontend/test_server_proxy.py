"""The pages' read-only look-ups on the inference server, against real HTTP servers."""

from __future__ import annotations

import asyncio
from concurrent.futures import ThreadPoolExecutor

import pytest

from frontend import server_proxy
from frontend.server_proxy import lookup, server_root
from tests.fakes.scripted_openai import free_port, scripted_server


def run(coro):
    """Run `coro` on its own loop in a worker thread: Playwright's sync API may hold this thread's loop."""
    with ThreadPoolExecutor(1) as pool:
        return pool.submit(asyncio.run, coro).result()


@pytest.mark.parametrize("base, root", [("http://h:8080/v1", "http://h:8080"), ("http://h:8080/v1/", "http://h:8080"),
                                        ("http://h/openai", "http://h/openai"), ("http://h:1/v10", "http://h:1/v10")])
def test_server_root_strips_only_a_trailing_v1(base, root):
    assert server_root(base) == root


def test_lookup_reports_404_and_unreachable_servers_in_words():
    with scripted_server([]) as fake:
        missing = run(lookup(fake.base_url, "cache-stats"))
    assert not missing.available and missing.status == 404
    assert missing.url.endswith(f":{fake.port}/cache/stats")
    assert "does not provide it" in missing.reason
    down = run(lookup(f"http://127.0.0.1:{free_port()}/v1", "props"))
    assert not down.available and down.status is None and "did not answer" in down.reason
    with pytest.raises(KeyError):
        run(lookup("http://127.0.0.1:9/v1", "../admin"))


def test_only_known_query_parameters_pass_to_the_server():
    assert server_proxy.passed_params("cache-stats", {"measure": "true", "x": "1"}) == {"measure": "true"}
    assert server_proxy.passed_params("cache-stats", {"measure": "drop table"}) == {}
    assert server_proxy.passed_params("props", {"measure": "true"}) == {}


def test_lookup_passes_the_server_json_through(monkeypatch):
    # the fake's /health stands in for a JSON endpoint at the server root
    monkeypatch.setitem(server_proxy.ENDPOINTS, "health", "/health")
    with scripted_server([]) as fake:
        found = run(lookup(fake.base_url, "health", api_key="secret"))
    assert found.available and found.status == 200 and found.data == {"status": "ok"}
