"""The operator token every test workbench runs with (tests/conftest.py puts it in the
environment, so in-process apps and `arbor serve` subprocesses alike read it), and the ways a
test client presents it: a Bearer header for the API, a session cookie for the browser."""

from __future__ import annotations

from typing import TYPE_CHECKING

from app.auth.operator_token import OperatorToken

if TYPE_CHECKING:
    from playwright._impl._api_structures import SetCookieParam

WORKBENCH_TOKEN = "test-workbench-token-for-the-suite"
#: TestClient's default Host; real servers in tests are reached as 127.0.0.1, a default name
TEST_HOSTS = "testserver"
AUTH_HEADERS = {"Authorization": f"Bearer {WORKBENCH_TOKEN}"}


def session_cookie() -> SetCookieParam:
    """The signed-in cookie for Playwright's `context.add_cookies`, valid for every loopback port."""
    return {"name": "arbor_session", "value": OperatorToken(WORKBENCH_TOKEN, "env").session_cookie(),
            "domain": "127.0.0.1", "path": "/", "httpOnly": True, "sameSite": "Strict"}
