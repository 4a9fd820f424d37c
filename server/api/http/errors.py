"""OpenAI-format errors: every 4xx/5xx body is {"error": {"message", "type", "param", "code"}}."""

from __future__ import annotations

import json
import logging
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from starlette.exceptions import HTTPException as StarletteHTTPException

log = logging.getLogger(__name__)


class ErrorJSONResponse(JSONResponse):
    """JSON in ASCII: an error message may quote request text, even a lone surrogate that has no
    UTF-8 form; escaped, it always encodes, so an error never turns into a dropped connection."""

    def render(self, content) -> bytes:
        return json.dumps(content, separators=(",", ":")).encode("ascii")


class APIError(Exception):
    def __init__(
        self,
        message: str,
        *,
        status: int = 400,
        type: str = "invalid_request_error",
        param: str | None = None,
        code: str | None = None,
        headers: dict[str, str] | None = None,
    ):
        super().__init__(message)
        self.message = message
        self.status = status
        self.type = type
        self.param = param
        self.code = code
        self.headers = headers

    def body(self) -> dict:
        return {"error": {"message": self.message, "type": self.type, "param": self.param, "code": self.code}}

    def response(self) -> JSONResponse:
        return ErrorJSONResponse(self.body(), status_code=self.status, headers=self.headers)


def invalid(message: str, param: str | None = None, code: str | None = None) -> APIError:
    return APIError(message, param=param, code=code)


def _loc_to_param(loc: tuple) -> str | None:
    parts = [str(p) for p in loc if p not in ("body", "query", "path")]
    return ".".join(parts) or None


def install_error_handlers(app: FastAPI) -> None:
    @app.exception_handler(APIError)
    async def _api_error(_: Request, exc: APIError):
        return exc.response()

    @app.exception_handler(RequestValidationError)
    async def _validation(_: Request, exc: RequestValidationError):
        errors = exc.errors()
        first: dict[str, Any] = errors[0] if errors else {"msg": "invalid request", "loc": ()}
        param = _loc_to_param(tuple(first.get("loc", ())))
        msg = first.get("msg", "invalid request")
        if first.get("type") == "json_invalid":
            msg, param = "request body is not valid JSON", None
        elif param:
            msg = f"{param}: {msg}"
        return APIError(msg, param=param, code=first.get("type")).response()

    @app.exception_handler(StarletteHTTPException)
    async def _http(_: Request, exc: StarletteHTTPException):
        kind = "not_found_error" if exc.status_code == 404 else "invalid_request_error"
        detail = exc.detail if isinstance(exc.detail, str) else json.dumps(exc.detail)
        return APIError(detail, status=exc.status_code, type=kind).response()

    @app.exception_handler(Exception)
    async def _unexpected(request: Request, exc: Exception):
        log.error("unexpected error on %s %s", request.method, request.url.path, exc_info=exc)
        return APIError(f"internal error: {exc}", status=500, type="server_error").response()
