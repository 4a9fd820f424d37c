"""FastAPI dependencies: the shared state, the loaded model, and the optional API key."""

from __future__ import annotations

import secrets
from typing import Annotated

from fastapi import Depends, Request

from server.api.errors import APIError
from server.api.state import ServerState
from server.bootstrap import LoadedModel


def get_state(request: Request) -> ServerState:
    return request.app.state.arbor


StateDep = Annotated[ServerState, Depends(get_state)]


def get_model(state: StateDep) -> LoadedModel:
    return state.require_model()


ModelDep = Annotated[LoadedModel, Depends(get_model)]


def require_api_key(request: Request, state: StateDep) -> None:
    """--api-key on every route but /health (and the pages it guards). Requests with a body met
    the same check in the request guard already, before their body was read."""
    err = api_key_error(request.headers.get("authorization"), state.settings.api_key,
                        x_api_key=request.headers.get("x-api-key"))
    if err is not None:
        raise err


def _same_key(sent: str, expected: str) -> bool:
    # compared as bytes: compare_digest refuses str with non-ASCII characters (a TypeError, so a 500),
    # and header values arrive as latin-1, which gives back the bytes the client sent
    return secrets.compare_digest(sent.strip().encode("latin-1", "replace"), expected.encode("utf-8"))


def api_key_error(authorization: str | None, expected: str | None, x_api_key: str | None = None) -> APIError | None:
    """The 401 for a request whose `Authorization` header (as received: latin-1 text) does not
    carry `Bearer <expected>` and whose `x-api-key` header (Anthropic's clients send that one)
    is not `<expected>`; None when either carries it, or when no key is configured."""
    if not expected:
        return None
    scheme, _, token = (authorization or "").partition(" ")
    bearer = scheme.lower() == "bearer" and _same_key(token, expected)
    if not bearer and not (x_api_key is not None and _same_key(x_api_key, expected)):
        return APIError("invalid or missing API key", status=401, type="authentication_error",
                        code="invalid_api_key", headers={"WWW-Authenticate": "Bearer"})
    return None
