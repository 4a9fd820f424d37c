"""Who may send what, checked before any route or model: the Host header (host_check.py), the
API key before the body is read, and JSON-only bodies (request_guard.py). No model loads: the
app answers these without one (a request that passes every check meets the 503 of a model still
loading, which is how the tests tell that it passed)."""

from __future__ import annotations

import pytest
from fastapi.testclient import TestClient
from pydantic import ValidationError

from server.api.app import create_app
from server.api.http.host_check import allowed_hosts, host_of
from server.cli import settings_from_args
from server.settings import ServerSettings

KEY = "k3y"
AUTH = {"Authorization": f"Bearer {KEY}"}
PASSED = 503  # every check passed; the route found the model still loading


def client(at: str = "localhost:8080", **settings) -> TestClient:
    return TestClient(create_app(ServerSettings(**settings)), base_url=f"http://{at}")


def error(r, status: int, code: str) -> dict:
    assert r.status_code == status, r.text
    err = r.json()["error"]
    assert set(err) == {"message", "type", "param", "code"} and err["code"] == code, err
    return err


# -- Host --------------------------------------------------------------------------------------

@pytest.mark.parametrize("host", ["localhost", "localhost:8080", "127.0.0.1:1", "[::1]:8080", "[::1]", "LOCALHOST"])
def test_localhost_names_are_allowed_by_default(host):
    assert client(host).get("/health").status_code == PASSED


@pytest.mark.parametrize("host", ["evil.example", "evil.example:8080", "localhost.evil.example", "127.0.0.2",
                                  "server:8080", "[::2]:80"])
def test_other_names_are_refused_in_openai_format(host):
    err = error(client(host).get("/health"), 400, "invalid_host")
    assert err["param"] == "Host" and "--allowed-hosts" in err["message"]
    error(client(host).post("/v1/chat/completions", json={}), 400, "invalid_host")  # before anything else


def test_missing_or_malformed_host_is_refused():
    app = create_app(ServerSettings())
    for raw in (None, "", "a b", "[zz]:80", "host:port"):
        headers = [] if raw is None else [(b"host", raw.encode())]
        sent = []

        async def receive():
            return {"type": "http.request", "body": b"", "more_body": False}

        async def send(message, sent=sent):
            sent.append(message)

        import asyncio
        asyncio.run(app({"type": "http", "method": "GET", "path": "/health", "raw_path": b"/health",
                         "query_string": b"", "headers": headers, "scheme": "http", "server": ("x", 80),
                         "client": ("1.2.3.4", 5), "root_path": "", "http_version": "1.1", "asgi": {"version": "3.0"}},
                        receive, send))
        assert sent[0]["status"] == 400, raw


def test_configured_names_wildcards_and_the_bound_host_are_allowed():
    c = client("server:8080", allowed_hosts="server,*.corp.example")
    assert c.get("/health").status_code == PASSED
    assert client("a.corp.example", allowed_hosts="*.corp.example").get("/health").status_code == PASSED
    assert client("corp.example", allowed_hosts="*.corp.example").get("/health").status_code == 400
    assert client("localhost", allowed_hosts="server").get("/health").status_code == PASSED  # still allowed
    assert client("10.1.2.3:8080", host="10.1.2.3").get("/health").status_code == PASSED
    assert client("[fe80::1]:8080", host="fe80::1").get("/health").status_code == PASSED
    assert client("anything.example", allowed_hosts="*").get("/health").status_code == PASSED


def test_a_wildcard_bind_adds_no_name():
    assert allowed_hosts(ServerSettings(host="0.0.0.0")) == ["localhost", "127.0.0.1", "::1", "[::1]"]
    assert allowed_hosts(ServerSettings(host="::", allowed_hosts="[::1],Box")) == [
        "localhost", "127.0.0.1", "::1", "[::1]", "box"]
    assert host_of("[::1]:8080") == "[::1]" and host_of("Example.COM:1") == "example.com" and host_of("a:b:c") is None


def test_the_flag_and_the_environment_parse(monkeypatch):
    assert settings_from_args(["--allowed-hosts", "server, server-2"]).allowed_hosts == ("server", "server-2")
    monkeypatch.setenv("ARBOR_SERVER_ALLOWED_HOSTS", "server,*.example.com")
    assert ServerSettings().allowed_hosts == ("server", "*.example.com")
    for bad in ("http://server", "server:8080", "*server", "[::1]:80", "a/b"):
        with pytest.raises(ValidationError, match="without scheme or port"):
            ServerSettings(allowed_hosts=bad)


# -- API key before the body -------------------------------------------------------------------

def test_the_key_is_checked_before_the_body_is_read():
    c = client(api_key=KEY)
    # a body too large, not JSON, of the wrong type: none of it matters without the key
    for kwargs in ({"content": b"x" * (5 * 2**20), "headers": {"content-type": "application/json"}},
                   {"content": b"[" * 100_000, "headers": {"content-type": "application/json"}},
                   {"content": b"a=1", "headers": {"content-type": "application/x-www-form-urlencoded"}}):
        err = error(c.post("/v1/chat/completions", **kwargs), 401, "invalid_api_key")
        assert err["type"] == "authentication_error"
    non_ascii = {"Authorization": "Bearer w\u00e9".encode("utf-8")}
    error(c.post("/v1/chat/completions", json={}, headers=non_ascii), 401, "invalid_api_key")
    r = c.post("/v1/chat/completions", content=b"x" * (5 * 2**20), headers={**AUTH, "content-type": "application/json"})
    error(r, 413, "request_too_large")  # with the key, the body is looked at


# -- JSON bodies only --------------------------------------------------------------------------

POST_ROUTES = ["/v1/chat/completions", "/chat/completions", "/v1/completions", "/completion", "/v1/embeddings",
               "/tokenize", "/detokenize", "/apply-template", "/cache/hint", "/cache/flush", "/flush_cache"]


@pytest.mark.parametrize("path", POST_ROUTES)
@pytest.mark.parametrize("ctype", ["text/plain", "application/x-www-form-urlencoded", "multipart/form-data; boundary=x",
                                   "text/json", "application/jsonl"])
def test_other_content_types_are_415_on_every_post_route(path, ctype):
    err = error(client().post(path, content=b'{"session": "s"}', headers={"content-type": ctype}), 415,
                "unsupported_media_type")
    assert err["param"] == "Content-Type" and "application/json" in err["message"]


@pytest.mark.parametrize("path", POST_ROUTES)
def test_a_body_without_content_type_is_415(path):
    error(client().post(path, content=b'{"session": "s"}'), 415, "unsupported_media_type")


@pytest.mark.parametrize("ctype", ["application/json", "application/json; charset=utf-8",
                                   "Application/JSON;charset=UTF-8", "application/vnd.example+json"])
def test_json_content_types_pass(ctype):
    assert client().post("/v1/chat/completions", content=b"{}", headers={"content-type": ctype}).status_code == PASSED


def test_the_openai_client_shape_passes():
    """What the openai client sends: JSON with its content type, the key as a bearer token."""
    r = client(api_key=KEY).post("/v1/chat/completions", json={"messages": [{"role": "user", "content": "x"}]},
                                 headers={**AUTH, "User-Agent": "OpenAI/Python 1.0", "Accept": "application/json"})
    assert r.status_code == PASSED


@pytest.mark.parametrize("path", ["/cache/flush", "/flush_cache"])
def test_a_bodiless_flush_passes_from_a_router_but_not_from_a_browser(path):
    c = client()
    assert c.post(path).status_code == PASSED  # SMG's POST /flush_cache: no body, no headers
    for origin in ("https://evil.example", "http://localhost:3000", "null"):
        err = error(c.post(path, headers={"Origin": origin}), 415, "unsupported_media_type")
        assert "Origin" in err["message"]
    r = c.post(path, headers={"Origin": "http://localhost:3000", "content-type": "application/json"})
    assert r.status_code == PASSED  # JSON forces a CORS preflight, so a foreign page cannot send it


def test_get_routes_need_no_content_type():
    assert client().get("/health", headers={"content-type": "text/plain"}).status_code == PASSED
