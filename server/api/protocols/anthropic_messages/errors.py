"""Anthropic's error format on the Messages API's routes.

Every error of `/v1/messages` and `/v1/messages/...` has the body
`{"type": "error", "error": {"type": ..., "message": ...}}`, whoever raised it: the request
guard (API key, content type, size and limits, before any route runs), FastAPI's validation and
404s, the route itself, or an unexpected exception. `AnthropicErrors` is an ASGI middleware that
rewrites the OpenAI-format error bodies the rest of the server writes (server.api.http.errors) on
these paths only, and answers an unexpected exception itself (logged, its text not sent); the
status code stays. The error type follows the status as Anthropic's does (a 503 is
`overloaded_error`, Anthropic's 529). An error inside a started stream is an `error` event
(server.api.protocols.anthropic_messages.events).
"""

from __future__ import annotations

import json
import logging
from typing import Any

from server.api.http.errors import APIError

log = logging.getLogger(__name__)

PATH = "/v1/messages"

_TYPES = {400: "invalid_request_error", 401: "authentication_error", 403: "permission_error",
          404: "not_found_error", 413: "request_too_large", 429: "rate_limit_error", 503: "overloaded_error",
          529: "overloaded_error"}


def error_type(status: int) -> str:
    return _TYPES.get(status, "api_error" if status >= 500 else "invalid_request_error")


def error_body(status: int, message: str) -> dict[str, Any]:
    return {"type": "error", "error": {"type": error_type(status), "message": message}}


def from_api_error(err: APIError) -> dict[str, Any]:
    return error_body(err.status, err.message)


def _rewritten(status: int, body: bytes) -> bytes:
    """An OpenAI-format error body in Anthropic's format (any other body's text as the message)."""
    try:
        data = json.loads(body)
    except ValueError:
        data = None
    if isinstance(data, dict) and data.get("type") == "error":
        return body  # already Anthropic's
    inner = data.get("error") if isinstance(data, dict) else None
    if isinstance(inner, dict) and isinstance(inner.get("message"), str):
        message = inner["message"]
    else:
        message = body.decode("utf-8", "replace")[:1000] or f"HTTP {status}"
    # ASCII, as every error body here: a message may quote request text (server.api.http.errors)
    return json.dumps(error_body(status, message), separators=(",", ":")).encode("ascii")


def is_messages_path(path: str) -> bool:
    return path == PATH or path.startswith(PATH + "/")


class AnthropicErrors:
    """Pure ASGI: other paths, successful answers and streams pass through untouched."""

    def __init__(self, app):
        self.app = app

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http" or not is_messages_path(scope.get("path", "")):
            return await self.app(scope, receive, send)
        start: dict[str, Any] | None = None
        chunks: list[bytes] = []
        started = False

        async def send_rewritten(message):
            nonlocal start, started
            if message["type"] == "http.response.start":
                started = True
                if message["status"] < 400:
                    return await send(message)
                start = message
                return None
            if start is None or message["type"] != "http.response.body":
                return await send(message)
            chunks.append(message.get("body", b""))
            if message.get("more_body", False):
                return None
            body = _rewritten(start["status"], b"".join(chunks))
            headers = [(k, v) for k, v in start.get("headers", []) if k.lower() not in (b"content-length",
                                                                                        b"content-type")]
            headers += [(b"content-length", str(len(body)).encode()), (b"content-type", b"application/json")]
            await send({**start, "headers": headers})
            await send({"type": "http.response.body", "body": body})

        try:
            await self.app(scope, receive, send_rewritten)
        except Exception as exc:  # anything the handlers left: answered in Anthropic's format, logged
            if started:
                raise
            log.error("unexpected error on %s %s", scope.get("method"), scope.get("path"), exc_info=exc)
            body = json.dumps(error_body(500, "internal server error"), separators=(",", ":")).encode("ascii")
            await send({"type": "http.response.start", "status": 500,
                        "headers": [(b"content-type", b"application/json"),
                                    (b"content-length", str(len(body)).encode())]})
            await send({"type": "http.response.body", "body": body})
