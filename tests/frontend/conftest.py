"""Browser fixtures: Debian's Chromium through Playwright, the live workbench, screenshots on failure."""

from __future__ import annotations

import re

import pytest

from tests.frontend.support import (
    CHROMIUM,
    CHROMIUM_ARGS,
    REPO,
    ConversationScript,
    incident_service,
    live_workbench,
)
from tests.workbench_auth import session_cookie

ARTIFACTS = REPO / "test-artifacts"


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    outcome = yield
    report = outcome.get_result()
    setattr(item, f"rep_{report.when}", report)


@pytest.fixture(scope="module")
def browser():
    """Module-scoped: Playwright's sync API keeps an event loop running in this thread while it
    is open, which would break every asyncio test collected after the browser tests."""
    if not CHROMIUM.exists():
        pytest.skip(f"{CHROMIUM} is missing: install Debian's chromium (apt-get install -y chromium)")
    try:
        from playwright.sync_api import sync_playwright
    except ImportError:
        pytest.skip("the playwright Python package is not installed")
    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=str(CHROMIUM), headless=True, args=CHROMIUM_ARGS)
        yield browser
        browser.close()


@pytest.fixture(scope="session")
def real_server(tmp_path_factory):
    """arbor-server on the embedded model (2 slots), shared by the browser tests that need one."""
    from tests.server.conftest import start_server, stop_server

    server = start_server(tmp_path_factory.mktemp("arbor-server"), "--parallel", "2", "--ctx-size", "8192")
    yield server
    stop_server(server)


@pytest.fixture(scope="session")
def incident_url():
    with incident_service("degraded") as url:
        yield url


@pytest.fixture
def script() -> ConversationScript:
    return ConversationScript()


@pytest.fixture
def workbench(tmp_path, incident_url, script):
    with live_workbench(tmp_path / "var", incident_url, script) as live:
        yield live


@pytest.fixture
def page(request, browser):
    """A fresh page at 1280x900; on failure its screenshot goes to test-artifacts/."""
    context = browser.new_context(viewport={"width": 1280, "height": 900})
    context.set_default_timeout(15_000)
    context.add_cookies([session_cookie()])  # signed in; test_signin.py starts signed out
    page = context.new_page()
    errors: list[str] = []
    page.on("pageerror", lambda exc: errors.append(str(exc)))
    page.js_errors = errors
    yield page
    failed = getattr(request.node, "rep_call", None) is not None and request.node.rep_call.failed
    if failed:
        ARTIFACTS.mkdir(exist_ok=True)
        name = re.sub(r"[^A-Za-z0-9_.-]+", "_", request.node.nodeid)[-150:]
        try:
            page.screenshot(path=str(ARTIFACTS / f"{name}.png"), full_page=True)
        except Exception as exc:  # noqa: BLE001  a crashed page must not hide the test's own failure
            print(f"screenshot failed: {exc}")
    context.close()
