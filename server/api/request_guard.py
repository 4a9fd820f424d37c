"""The request guard: size and shape limits on JSON bodies, checked before any route runs.

A pure ASGI middleware (so streaming and disconnect detection pass through untouched). For a
request with a body it:

- refuses a body larger than ``--max-body-kib`` with 413, from Content-Length when given, else
  while reading (it never buffers more than the limit);
- parses the JSON once and refuses, with 400, nesting deeper than ``--max-json-depth`` (Python's
  decoder would otherwise hit its recursion limit), a string holding a lone UTF-16 surrogate
  (``"\\ud800"`` decodes to a Python str that cannot be encoded as UTF-8, so it would fail deep
  in tokenization or while writing the reply), more than ``--max-messages`` messages, more than
  ``--max-tools`` tools, more than ``--max-stop`` stop strings, and a stop string longer than
  ``--max-stop-chars`` characters (the engine holds back output that could begin one);
- then hands the app the same bytes, so FastAPI's own parsing and validation run as before.

A body that is not JSON passes through: the routes answer it with their own 400. Errors use the
OpenAI format (server.api.errors) and name the flag that sets the limit.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from server.api.errors import APIError
from server.settings import ServerSettings


@dataclass(frozen=True)
class Limits:
    body_bytes: int
    json_depth: int
    messages: int
    tools: int
    stop: int
    stop_chars: int

    @classmethod
    def from_settings(cls, s: ServerSettings) -> Limits:
        return cls(s.max_body_kib * 1024, s.max_json_depth, s.max_messages, s.max_tools, s.max_stop,
                   s.max_stop_chars)


class _TooLarge(Exception):
    pass


class RequestGuard:
    def __init__(self, app, settings: ServerSettings):
        self.app = app
        self.limits = Limits.from_settings(settings)

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http" or scope["method"] in ("GET", "HEAD", "OPTIONS"):
            return await self.app(scope, receive, send)
        try:
            body = await self._read_body(scope, receive)
            check_body(body, self.limits)
        except APIError as err:
            return await err.response()(scope, receive, send)
        replayed = False

        async def replay():
            nonlocal replayed
            if not replayed:
                replayed = True
                return {"type": "http.request", "body": body, "more_body": False}
            return await receive()  # later messages: http.disconnect, which streaming watches for

        await self.app(scope, replay, send)

    async def _read_body(self, scope, receive) -> bytes:
        limit = self.limits.body_bytes
        declared = dict(scope["headers"]).get(b"content-length")
        if declared is not None and declared.isdigit() and int(declared) > limit:
            raise _too_large(int(declared), limit)
        chunks, size = [], 0
        while True:
            message = await receive()
            if message["type"] == "http.disconnect":
                break
            chunk = message.get("body", b"")
            size += len(chunk)
            if size > limit:
                raise _too_large(size, limit, at_least=True)
            chunks.append(chunk)
            if not message.get("more_body", False):
                break
        return b"".join(chunks)


def _too_large(size: int, limit: int, at_least: bool = False) -> APIError:
    more = "more than " if at_least else ""
    return APIError(f"request body of {more}{size} bytes is larger than this server accepts ({limit} bytes; "
                    "--max-body-kib)", status=413, code="request_too_large")


def check_body(body: bytes, limits: Limits) -> None:
    """400 (APIError) when a JSON body breaks a limit; a body that is not JSON is left to the route."""
    if not body:
        return
    try:
        data = json.loads(body)
    except RecursionError:  # nested past Python's own limit (about 1000 levels)
        raise _too_deep(limits) from None
    except ValueError:  # not JSON: the route says so
        return
    _check_values(data, limits)
    if not isinstance(data, dict):
        return
    for key, limit, flag in (("messages", limits.messages, "--max-messages"), ("tools", limits.tools, "--max-tools"),
                             ("stop", limits.stop, "--max-stop")):
        value = data.get(key)
        if isinstance(value, list) and len(value) > limit:
            raise APIError(f"{key}: {len(value)} given; this server accepts at most {limit} ({flag})", param=key,
                           code=f"too_many_{key}")
    stops = data.get("stop")
    for stop in [stops] if isinstance(stops, str) else stops if isinstance(stops, list) else ():
        if isinstance(stop, str) and len(stop) > limits.stop_chars:
            raise APIError(f"stop: a stop string of {len(stop)} characters; this server accepts at most "
                           f"{limits.stop_chars} (--max-stop-chars)", param="stop", code="stop_too_long")


def _check_values(data: Any, limits: Limits) -> None:
    """Depth and lone surrogates, walked without recursion."""
    stack: list[tuple[Any, int, str]] = [(data, 1, "")]
    while stack:
        value, depth, path = stack.pop()
        if isinstance(value, str):
            _check_text(value, path)
            continue
        if not isinstance(value, (dict, list)):
            continue
        if depth > limits.json_depth:
            raise _too_deep(limits)
        items = value.items() if isinstance(value, dict) else enumerate(value)
        for key, item in items:
            where = f"{path}.{key}" if path else str(key)
            if isinstance(key, str):
                _check_text(key, where)
            stack.append((item, depth + 1, where))


def _check_text(text: str, path: str) -> None:
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as exc:
        raise APIError(f"{path or 'body'}: contains a lone UTF-16 surrogate (\\u{ord(text[exc.start]):04x}) at "
                       f"character {exc.start}, which is not valid Unicode text", param=path or None,
                       code="invalid_unicode") from None


def _too_deep(limits: Limits) -> APIError:
    return APIError(f"request body is nested deeper than {limits.json_depth} levels (--max-json-depth)",
                    code="too_deeply_nested")

