"""FastAPI dependencies: the shared state, the loaded model, and the optional API key(s)."""

from __future__ import annotations

import hashlib
import secrets
from typing import Annotated

from fastapi import Depends, Request

from server.api.http.errors import APIError
from server.api.http.state import ServerState
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


def api_keys(expected: str | None) -> list[str]:
    """The keys --api-key configures: several are separated by commas (as llama-server's)."""
    return [k.strip() for k in (expected or "").split(",") if k.strip()]


def authenticated_key(authorization: str | None, expected: str | None, x_api_key: str | None = None) -> str | None:
    """The configured key that the request's `Authorization: Bearer` (as received: latin-1 text)
    or `x-api-key` header (Anthropic's clients send that one) carries, or None. Every key is
    compared, in constant time each, whichever matches."""
    scheme, _, token = (authorization or "").partition(" ")
    bearer = token if scheme.lower() == "bearer" else None
    found = None
    for key in api_keys(expected):
        hit = (bearer is not None and _same_key(bearer, key)) | (x_api_key is not None and _same_key(x_api_key, key))
        if hit and found is None:
            found = key
    return found


def api_key_id(key: str) -> str:
    """A key's name in the cache (--cache-salt-per-key): a hash, never the key itself."""
    return hashlib.sha256(b"arbor api key|" + key.encode("utf-8")).hexdigest()[:32]


def api_key_error(authorization: str | None, expected: str | None, x_api_key: str | None = None) -> APIError | None:
    """The 401 for a request whose `Authorization` header does not carry `Bearer <key>` and
    whose `x-api-key` header is not `<key>`, for any configured key; None when one carries
    one, or when no key is configured."""
    if not api_keys(expected):
        return None
    if authenticated_key(authorization, expected, x_api_key) is None:
        return APIError("invalid or missing API key", status=401, type="authentication_error",
                        code="invalid_api_key", headers={"WWW-Authenticate": "Bearer"})
    return None
