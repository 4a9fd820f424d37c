"""CORS: localhost origins by default, an explicit allow-list with --cors-origins."""

from __future__ import annotations

import httpx
import pytest
from fastapi.testclient import TestClient
from pydantic import ValidationError

from server.api.app import create_app
from server.cli import settings_from_args
from server.settings import ServerSettings

PREFLIGHT = {"Access-Control-Request-Method": "POST", "Access-Control-Request-Headers": "authorization,content-type"}


def preflight(client, origin: str, path: str = "/v1/chat/completions"):
    return client.options(path, headers={"Origin": origin, **PREFLIGHT})


def app_client(**settings) -> TestClient:
    # No `with`: the lifespan (model load) does not run; CORS answers without a model. The
    # client names the server `localhost` (TestClient's own `testserver` is not an allowed Host).
    return TestClient(create_app(ServerSettings(**settings)), base_url="http://localhost")


@pytest.mark.parametrize("origin", ["http://localhost:5173", "http://127.0.0.1", "https://[::1]:8443"])
def test_default_reflects_localhost_origins(origin):
    r = preflight(app_client(), origin)
    assert r.status_code == 200
    assert r.headers["access-control-allow-origin"] == origin
    assert "authorization" in r.headers["access-control-allow-headers"].lower()


@pytest.mark.parametrize("origin", ["https://evil.example", "http://localhost.evil.example", "null"])
def test_default_refuses_other_origins(origin):
    c = app_client()
    assert "access-control-allow-origin" not in preflight(c, origin).headers
    assert "access-control-allow-origin" not in c.get("/health", headers={"Origin": origin}).headers


def test_allow_list_replaces_localhost():
    c = app_client(cors_origins="https://app.example, https://b.example/")
    assert preflight(c, "https://b.example").headers["access-control-allow-origin"] == "https://b.example"
    assert "access-control-allow-origin" not in preflight(c, "http://localhost:3000").headers


def test_star_allows_any_origin_and_the_flag_parses():
    s = settings_from_args(["--cors-origins", "*"])
    assert s.cors_origins == ("*",)
    client = TestClient(create_app(s), base_url="http://localhost")
    r = client.get("/health", headers={"Origin": "https://anywhere.example"})
    assert r.headers["access-control-allow-origin"] == "*"


def test_malformed_origin_is_refused_at_startup():
    with pytest.raises(ValidationError, match="scheme://host"):
        ServerSettings(cors_origins="app.example")


@pytest.mark.model
def test_real_server_answers_cors_on_alias_paths(arbor_server):
    origin = "http://localhost:3000"
    r = httpx.options(arbor_server.base_url + "/chat/completions", headers={"Origin": origin, **PREFLIGHT})
    assert r.status_code == 200 and r.headers["access-control-allow-origin"] == origin
    r = httpx.post(arbor_server.v1 + "/completions", headers={"Origin": origin},
                   json={"prompt": "Hi", "max_tokens": 1}, timeout=60)
    assert r.status_code == 200 and r.headers["access-control-allow-origin"] == origin
