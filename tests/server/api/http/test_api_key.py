"""require_api_key on its own (no model): the key is compared as the bytes the client sent, so a
token with non-ASCII characters is refused with 401 (compare_digest on such a str raised, a 500),
and a key with non-ASCII characters itself works when the client sends it UTF-8 encoded."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
from starlette.requests import Request

from server.api.http.deps import require_api_key
from server.api.http.errors import APIError


def request_with(authorization: bytes) -> Request:
    return Request({"type": "http", "method": "GET", "path": "/v1/models",
                    "headers": [(b"authorization", authorization)]})


def state(key: str) -> SimpleNamespace:
    return SimpleNamespace(settings=SimpleNamespace(api_key=key))


@pytest.mark.parametrize("header", [b"Bearer s\xc3\xa9cret", b"Bearer \xff\xfe", b"Bearer secret\xe2\x80\x8b",
                                    b"Basic secret", b"Bearer"])
def test_a_wrong_key_is_401_whatever_its_bytes(header):
    with pytest.raises(APIError) as info:
        require_api_key(request_with(header), state("secret"))
    assert info.value.status == 401 and info.value.code == "invalid_api_key"


def test_the_right_key_passes_ascii_or_not():
    require_api_key(request_with(b"Bearer secret"), state("secret"))
    require_api_key(request_with(b"bearer  secret "), state("secret"))
    require_api_key(request_with("Bearer clé-ключ".encode()), state("clé-ключ"))
