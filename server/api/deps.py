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
    """Bearer --api-key on every route but /health (and the pages it guards)."""
    expected = state.settings.api_key
    if not expected:
        return
    header = request.headers.get("authorization", "")
    scheme, _, token = header.partition(" ")
    # compared as bytes: compare_digest refuses str with non-ASCII characters (a TypeError, so a 500),
    # and header values arrive as latin-1, which gives back the bytes the client sent
    sent, wanted = token.strip().encode("latin-1", "replace"), expected.encode("utf-8")
    if scheme.lower() != "bearer" or not secrets.compare_digest(sent, wanted):
        raise APIError("invalid or missing API key", status=401, type="authentication_error",
                       code="invalid_api_key", headers={"WWW-Authenticate": "Bearer"})
