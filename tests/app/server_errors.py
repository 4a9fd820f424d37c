"""The suite fails on any 5xx a workbench answers a test, unless the test expects one.

Every HTTP client the tests use to reach a workbench is an httpx client (Starlette's TestClient
is one of httpx2, `httpx.post`, `httpx.stream` and the SSE readers are httpx's), so the check sits
in `send` of both libraries' `Client` and `AsyncClient`: a response with a status of 500 or more
to a request a workbench receives is recorded for the running test (tests/app/conftest.py fails
the test with it). A request goes to a workbench when it is TestClient's (`testserver`) or
carries the suite's operator token (tests/workbench_auth.py), which no model server, fake or
incident service is ever sent: the model backend's own 5xx (a scripted 503, say) reach the
workbench, not the test, and are not counted.

A test that provokes a 5xx on purpose says so with ``@pytest.mark.expects_5xx`` (the workbench's
502 for a failed model backend, a 500 a test injects); `expected_5xx` (the fixture) does the same
for a block inside a test.
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Iterator
from typing import Any

import httpx
import httpx2

from tests.workbench_auth import WORKBENCH_TOKEN

MARKER = "expects_5xx"
_BEARER = f"Bearer {WORKBENCH_TOKEN}"


class ServerErrors:
    """The 5xx answers workbenches gave during the current test (from any thread)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.seen: list[str] = []
        self.allowed = 0  # > 0 while a test's `expected_5xx` block runs

    def reset(self) -> None:
        with self._lock:
            self.seen, self.allowed = [], 0

    def record(self, request: Any, response: Any) -> None:
        if response.status_code < 500 or not _to_workbench(request):
            return
        with self._lock:
            if self.allowed:
                return
            body = ""
            with contextlib.suppress(Exception):  # a streamed body is not read here
                body = response.text[:300]
            self.seen.append(f"{request.method} {request.url} -> {response.status_code} {body}".strip())

    @contextlib.contextmanager
    def expected(self) -> Iterator[None]:
        with self._lock:
            self.allowed += 1
        try:
            yield
        finally:
            with self._lock:
                self.allowed -= 1


SERVER_ERRORS = ServerErrors()


def _to_workbench(request: Any) -> bool:
    return request.url.host == "testserver" or request.headers.get("authorization") == _BEARER


def install() -> None:
    """Wrap `send` of httpx's and httpx2's clients (once per process)."""
    for client in (httpx.Client, httpx2.Client):
        if getattr(client.send, "_checks_5xx", False):
            continue
        original = client.send

        def send(self, request, *args, _original=original, **kwargs):
            response = _original(self, request, *args, **kwargs)
            SERVER_ERRORS.record(request, response)
            return response

        send._checks_5xx = True  # type: ignore[attr-defined]
        client.send = send  # type: ignore[method-assign]
    for async_client in (httpx.AsyncClient, httpx2.AsyncClient):
        if getattr(async_client.send, "_checks_5xx", False):
            continue
        original_async = async_client.send

        async def send_async(self, request, *args, _original=original_async, **kwargs):
            response = await _original(self, request, *args, **kwargs)
            SERVER_ERRORS.record(request, response)
            return response

        send_async._checks_5xx = True  # type: ignore[attr-defined]
        async_client.send = send_async  # type: ignore[method-assign]
