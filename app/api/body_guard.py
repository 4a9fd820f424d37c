"""Body guard for the workbench API: a JSON body the routes could not store or answer safely is
refused before any route runs, with the workbench's readable error format.

- larger than room for the longest allowed message (``max_message_chars``, at the 6 bytes of a
  ``\\uXXXX`` escape per character) plus 64 KiB of other fields: 413 ``request_too_large``;
- nested past Python's recursion limit: 400 ``invalid_request``;
- holding a lone UTF-16 surrogate (``"\\ud800"``): 400 ``invalid_unicode``. Python decodes it,
  but neither SQLite nor the JSON answer can encode it, so it used to end in a 500 or a reset
  connection.

Pure ASGI, so SSE turns stream as before; a body that is not JSON is left to the route's 422.
"""

from __future__ import annotations

import json

from fastapi.responses import JSONResponse

from app.errors import WorkbenchError


class BodyGuard:
    def __init__(self, app, max_message_chars: int):
        self.app = app
        self.max_bytes = 6 * max_message_chars + 64 * 1024

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http" or scope["method"] not in ("POST", "PUT", "PATCH"):
            return await self.app(scope, receive, send)
        chunks: list[bytes] = []
        size, more = 0, True
        while more:
            message = await receive()
            if message["type"] != "http.request":
                break
            chunks.append(message.get("body", b""))
            size += len(chunks[-1])
            more = message.get("more_body", False)
            if size > self.max_bytes:
                return await _refuse(413, f"request body of more than {self.max_bytes} bytes; the limit follows "
                                     "ARBOR_MAX_MESSAGE_CHARS", "request_too_large")(scope, receive, send)
        body = b"".join(chunks)
        problem = _problem(body)
        if problem:
            return await _refuse(400, *problem)(scope, receive, send)
        pending = [{"type": "http.request", "body": body, "more_body": False}]

        async def buffered():
            return pending.pop() if pending else await receive()

        await self.app(scope, buffered, send)


def _problem(body: bytes) -> tuple[str, str] | None:
    try:
        data = json.loads(body) if body else None
        json.dumps(data, ensure_ascii=False).encode("utf-8")
    except RecursionError:
        return "request body is nested too deeply", "invalid_request"
    except UnicodeEncodeError as exc:
        bad = exc.object[exc.start]
        return (f"request body contains a lone UTF-16 surrogate (\\u{ord(bad):04x}), which is not valid Unicode "
                "text", "invalid_unicode")
    except ValueError:
        return None  # not JSON: the route answers 422
    return None


def _refuse(status: int, message: str, error_type: str) -> JSONResponse:
    return JSONResponse(status_code=status, content=WorkbenchError(message, error_type, status).to_body())
