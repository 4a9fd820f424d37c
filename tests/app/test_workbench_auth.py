"""Sign-in for the workbench (issue 35, items 1 and 2): every route but the open ones refuses a
caller without the operator token, the pages sign in by cookie, cross-site requests and
non-JSON bodies are refused, the Host header is checked, the token is generated once."""

from __future__ import annotations

import os
import re
import stat

import pytest
from fastapi.testclient import TestClient
from starlette.routing import Mount

from app.auth.guard import SESSION_COOKIE, is_open_path
from app.auth.operator_token import OperatorToken, resolve_token
from app.cli import main
from app.main import create_app
from tests.app.support import decide, lab_catalog, make_settings, new_session, post_turn
from tests.fakes.scripted_openai import ScriptedReply, scripted_server, tool_call
from tests.workbench_auth import AUTH_HEADERS, WORKBENCH_TOKEN

JSON = {"Accept": "application/json"}


def _client(settings, **kwargs) -> TestClient:
    return TestClient(create_app(settings, lab_catalog()), raise_server_exceptions=False, **kwargs)


def _concrete(path: str) -> str:
    return re.sub(r"\{[^}]+\}", "x", path)


def _routes(routes, prefix: str = "") -> list[tuple[str, str]]:
    """(method, concrete path) of every route, static mount included. FastAPI >= 0.16x keeps an
    included router as one entry (`original_router`, whose routes carry their own router's
    prefix but not the prefixes above it); older releases list the routes flat."""
    found = []
    for route in routes:
        included = getattr(route, "original_router", None)
        if included is not None:
            for child in included.routes:
                nested = getattr(child, "original_router", None) is not None
                found += _routes([child], prefix + included.prefix if nested else prefix)
        elif isinstance(route, Mount):
            found.append(("GET", prefix + route.path + "/arbor.css"))
        else:
            found += [(method, _concrete(prefix + route.path)) for method in sorted(route.methods or {"GET"})]
    return found


def test_every_route_refuses_a_caller_without_the_token(tmp_path):
    """Walks the routing table, so a route added later is covered without editing this test."""
    with scripted_server([]) as fake, _client(make_settings(tmp_path, fake.base_url)) as client:
        routes = _routes(client.app.routes)
        assert ("POST", "/api/approvals/x") in routes and ("GET", "/sessions/x/trace") in routes
        assert len(routes) > 30, routes  # the API, the pages, the docs: a table, not a handful
        closed = [(m, p) for m, p in routes if not is_open_path(p)]
        opened = {p for _, p in routes if is_open_path(p)}
        assert opened == {"/healthz", "/signin", "/static/arbor.css"}  # and nothing a later route adds
        for method, path in closed:
            for headers in ({}, {"Authorization": "Bearer wrong-token-0123456789"},
                            {"Authorization": "Bearer ünïcode-token".encode()},
                            {"Cookie": f"{SESSION_COOKIE}=1.forged"}):
                response = client.request(method, path, headers={**JSON, **headers},
                                          json={} if method != "GET" else None)
                assert response.status_code == 401, (method, path, headers, response.status_code)
                assert response.headers["www-authenticate"] == "Bearer"
                if method != "HEAD":  # a HEAD answer has no body
                    assert response.json()["error"]["type"] == "unauthorized", (method, path)
        # the open health probe tells nothing but that the process answers
        assert client.get("/healthz").json() == {"status": "ok"}


def test_the_token_opens_every_api_route(tmp_path):
    with scripted_server([]) as fake, _client(make_settings(tmp_path, fake.base_url)) as client:
        assert client.get("/api/sessions", headers=AUTH_HEADERS).status_code == 200
        assert client.get("/api/health", headers=AUTH_HEADERS).json()["database"] == "ok"
        assert client.get("/openapi.json", headers=AUTH_HEADERS).status_code == 200


def test_a_page_signs_in_by_cookie_and_returns_where_it_was_going(tmp_path):
    with scripted_server([]) as fake, _client(make_settings(tmp_path, fake.base_url)) as client:
        page = client.get("/cache", headers={"Accept": "text/html"}, follow_redirects=False)
        assert page.status_code == 303 and page.headers["location"] == "/signin?next=/cache"
        form = client.get("/signin?next=/cache")
        assert form.status_code == 200 and 'name="token"' in form.text and 'value="/cache"' in form.text

        wrong = client.post("/signin", content="token=nope&next=/cache",
                            headers={"Content-Type": "application/x-www-form-urlencoded"}, follow_redirects=False)
        assert wrong.status_code == 401 and "not this workbench" in wrong.text
        assert SESSION_COOKIE not in wrong.cookies

        right = client.post("/signin", content=f"token={WORKBENCH_TOKEN}&next=/cache",
                            headers={"Content-Type": "application/x-www-form-urlencoded"}, follow_redirects=False)
        assert right.status_code == 303 and right.headers["location"] == "/cache"
        cookie = right.headers["set-cookie"]
        assert "HttpOnly" in cookie and "SameSite=strict" in cookie and "Max-Age=604800" in cookie
        assert client.get("/cache").status_code == 200
        assert client.get("/api/sessions").status_code == 200  # the pages' scripts ride on the cookie

        out = client.post("/signout", headers={"Origin": "http://testserver"}, follow_redirects=False)
        assert out.status_code == 303
        client.cookies.clear()
        assert client.get("/api/sessions").status_code == 401


@pytest.mark.parametrize("target", ["//evil.example/x", "https://evil.example/", "/\\evil.example", ""])
def test_sign_in_never_redirects_off_the_site(tmp_path, target):
    with scripted_server([]) as fake, _client(make_settings(tmp_path, fake.base_url)) as client:
        response = client.get("/signin", params={"token": WORKBENCH_TOKEN, "next": target}, follow_redirects=False)
        assert response.status_code == 303 and response.headers["location"] == "/"


def test_a_cookie_request_from_another_site_is_refused(tmp_path):
    with scripted_server([]) as fake, _client(make_settings(tmp_path, fake.base_url)) as client:
        client.get("/signin", params={"token": WORKBENCH_TOKEN})
        for foreign in ({"Origin": "http://evil.example"}, {"Origin": "null"}, {"Sec-Fetch-Site": "cross-site"}):
            refused = client.post("/api/sessions", json={"scenario": "lab"}, headers=foreign)
            assert refused.status_code == 403 and refused.json()["error"]["type"] == "cross_site", foreign
        assert client.get("/api/sessions").json() == []  # nothing was created
        same = client.post("/api/sessions", json={"scenario": "lab"}, headers={"Origin": "http://testserver"})
        assert same.status_code == 201
        # a Bearer client carries no ambient credential: its Origin is its own business
        client.cookies.clear()
        api = client.post("/api/sessions", json={"scenario": "lab"}, headers={**AUTH_HEADERS, "Origin": "http://x"})
        assert api.status_code == 201


@pytest.mark.parametrize("content_type", ["text/plain", "application/x-www-form-urlencoded", "multipart/form-data",
                                          None])
def test_an_api_body_must_be_json(tmp_path, content_type):
    with scripted_server([]) as fake, _client(make_settings(tmp_path, fake.base_url), headers=AUTH_HEADERS) as client:
        headers = {"Content-Type": content_type} if content_type else {}
        response = client.post("/api/sessions", content=b'{"scenario": "lab"}', headers=headers)
        assert response.status_code == 415 and response.json()["error"]["type"] == "unsupported_media_type"
        ok = client.post("/api/sessions", content=b'{"scenario": "lab"}',
                         headers={"Content-Type": "application/json; charset=utf-8"})
        assert ok.status_code == 201


def test_the_host_header_must_name_the_workbench(tmp_path):
    with scripted_server([]) as fake:
        with _client(make_settings(tmp_path, fake.base_url, allowed_hosts="")) as client:
            for host in ("evil.example", "testserver", "127.0.0.1.evil.example", "localhost.evil.example:8090"):
                refused = client.get("/healthz", headers={"Host": host})
                assert refused.status_code == 400 and refused.json()["error"]["type"] == "host_not_allowed"
                assert "ARBOR_ALLOWED_HOSTS" in refused.json()["error"]["message"]
            for host in ("localhost:8090", "127.0.0.1", "[::1]:8090", "LOCALHOST"):
                assert client.get("/healthz", headers={"Host": host}).status_code == 200, host
        with _client(make_settings(tmp_path, fake.base_url, allowed_hosts="arbor.example.org, other")) as client:
            assert client.get("/healthz", headers={"Host": "arbor.example.org:443"}).status_code == 200
            assert client.get("/healthz", headers={"Host": "evil.example"}).status_code == 400
        with _client(make_settings(tmp_path, fake.base_url, allowed_hosts="*")) as client:
            assert client.get("/healthz", headers={"Host": "anything.example"}).status_code == 200


def test_a_token_is_generated_once_private_and_announced(tmp_path, monkeypatch, capsys):
    monkeypatch.delenv("ARBOR_WORKBENCH_TOKEN")
    with scripted_server([]) as fake:
        settings = make_settings(tmp_path, fake.base_url)
        assert settings.workbench_token is None
        with _client(settings) as client:
            token_file = settings.data_dir / "workbench-token"
            token = token_file.read_text().strip()
            assert len(token) >= 40 and stat.S_IMODE(os.stat(token_file).st_mode) == 0o600
            announced = capsys.readouterr().err
            assert f"/signin?token={token}" in announced
            assert client.get("/api/sessions", headers={"Authorization": f"Bearer {token}"}).status_code == 200
            assert client.get("/api/sessions", headers=AUTH_HEADERS).status_code == 401
        with _client(settings):  # a restart keeps it and prints nothing
            assert token_file.read_text().strip() == token
            assert "token" not in capsys.readouterr().err
        # `arbor token` prints the same link; --rotate replaces it
        monkeypatch.setenv("ARBOR_DATA_DIR", str(settings.data_dir))
        assert main(["token"]) == 0 and capsys.readouterr().out.strip().endswith(f"?token={token}")
        assert main(["token", "--rotate"]) == 0
        assert token_file.read_text().strip() != token


def test_a_short_token_is_refused_at_start(tmp_path, monkeypatch):
    with pytest.raises(ValueError, match="at least 16"):
        resolve_token("short", tmp_path)


def test_a_cookie_dies_with_its_token_and_its_age():
    token = OperatorToken("first-token-0123456789", "env")
    cookie = token.session_cookie(now=1000)
    assert token.cookie_is_valid(cookie, 3600, now=2000)
    assert not token.cookie_is_valid(cookie, 3600, now=1000 + 3600)  # expired
    assert not OperatorToken("second-token-0123456789", "env").cookie_is_valid(cookie, 3600, now=2000)  # rotated
    assert not token.cookie_is_valid(cookie.replace("1000.", "1999."), 3600, now=2000)  # re-dated
    assert not token.cookie_is_valid("garbage", 3600, now=2000)


def test_a_trusted_proxys_identity_is_recorded_on_the_approval(tmp_path):
    script = [ScriptedReply(tool_calls=[tool_call("propose_action", {"action": "restart_service", "target": "api",
                                                                     "reason": "stuck"}, "c1")]),
              ScriptedReply(content="Done.")]
    with scripted_server(script) as fake:
        settings = make_settings(tmp_path, fake.base_url, identity_header="X-Forwarded-User")
        with _client(settings, headers={"X-Forwarded-User": "alice"}) as client:
            session = new_session(client)
            request = post_turn(client, session["id"], "Restart it")[-1]
            assert request["type"] == "approval_request"
            decide(client, request["approval_id"], True)
            assert client.get(f"/api/approvals/{request['approval_id']}").json()["decided_by"] == "alice"
            client.headers.pop("X-Forwarded-User")
            assert client.get("/api/sessions").status_code == 401  # without the proxy's header: signed out
