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
    """Bearer --api-key on every route but /health (and the pages it guards). Requests with a
    body met the same check in the request guard already, before their body was read."""
    err = api_key_error(request.headers.get("authorization"), state.settings.api_key)
    if err is not None:
        raise err


def api_key_error(authorization: str | None, expected: str | None) -> APIError | None:
    """The 401 for an `Authorization` header (as received: latin-1 text) that does not carry
    `Bearer <expected>`; None when it does, or when no key is configured."""
    if not expected:
        return None
    scheme, _, token = (authorization or "").partition(" ")
    # compared as bytes: compare_digest refuses str with non-ASCII characters (a TypeError, so a 500),
    # and header values arrive as latin-1, which gives back the bytes the client sent
    sent, wanted = token.strip().encode("latin-1", "replace"), expected.encode("utf-8")
    if scheme.lower() != "bearer" or not secrets.compare_digest(sent, wanted):
        return APIError("invalid or missing API key", status=401, type="authentication_error",
                        code="invalid_api_key", headers={"WWW-Authenticate": "Bearer"})
    return None
