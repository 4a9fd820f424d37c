"""Read-only look-ups on the inference server for the pages (cache stats, props, slots).

The workbench talks to its model backend only over HTTP. Chat goes through the OpenAI API
(`LLM_BASE_URL`, e.g. http://127.0.0.1:8080/v1); the llama-server style endpoints the pages
show (/props, /slots, /cache/stats) live at the server's root, i.e. the base URL without a
trailing /v1. Stock llama-server has /props and /slots but no /cache/stats; vLLM and SGLang
have none of them. So every look-up answers a `ServerLookup` that says whether the data is
available and, when it is not, why, in words a page can show as is.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any
from urllib.parse import urlencode

import httpx

#: what a page may ask for -> the path on the inference server
ENDPOINTS: dict[str, str] = {"cache-stats": "/cache/stats", "props": "/props", "slots": "/slots"}

_TIMEOUT_S = 3.0
_MEASURE_TIMEOUT_S = 60.0  # measure=true reads the whole KV state on the server


@dataclass(frozen=True)
class ServerLookup:
    """The answer of one look-up: `data` is the server's JSON when `available`."""

    endpoint: str
    url: str
    available: bool
    status: int | None = None
    data: Any = None
    reason: str | None = None

    def to_dict(self) -> dict:
        return asdict(self)


def server_root(llm_base_url: str) -> str:
    """`http://host:8080/v1/` -> `http://host:8080` (any other path is kept as is)."""
    root = llm_base_url.rstrip("/")
    root = root.removesuffix("/v1")
    return root


#: query parameters a page may pass on, per endpoint (anything else is dropped)
PASSED_PARAMS: dict[str, dict[str, tuple[str, ...]]] = {"cache-stats": {"measure": ("true", "false")}}


def passed_params(endpoint: str, query: dict[str, str]) -> dict[str, str]:
    """The part of a page's query that `endpoint` takes (e.g. cache-stats' measure=true)."""
    allowed = PASSED_PARAMS.get(endpoint, {})
    return {k: v for k, v in query.items() if v in allowed.get(k, ())}


async def lookup(llm_base_url: str, endpoint: str, api_key: str | None = None,
                 client: httpx.AsyncClient | None = None, params: dict[str, str] | None = None) -> ServerLookup:
    """GET one of `ENDPOINTS` on the server behind `llm_base_url`; never raises for HTTP trouble."""
    if endpoint not in ENDPOINTS:
        raise KeyError(f"unknown server endpoint {endpoint!r}; known: {', '.join(ENDPOINTS)}")
    url = server_root(llm_base_url) + ENDPOINTS[endpoint]
    if params:
        url += "?" + urlencode(params)
    headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
    owned = client is None
    client = client or httpx.AsyncClient(timeout=_MEASURE_TIMEOUT_S if params else _TIMEOUT_S)
    try:
        response = await client.get(url, headers=headers)
    except httpx.HTTPError as exc:
        return ServerLookup(endpoint, url, False, reason=f"the server did not answer ({type(exc).__name__})")
    finally:
        if owned:
            await client.aclose()
    if response.status_code == 404:
        return ServerLookup(endpoint, url, False, 404, reason="this server does not provide it (HTTP 404)")
    if response.status_code != 200:
        return ServerLookup(endpoint, url, False, response.status_code,
                            reason=f"the server answered HTTP {response.status_code}")
    try:
        data = response.json()
    except ValueError:
        return ServerLookup(endpoint, url, False, 200, reason="the server's answer is not JSON")
    return ServerLookup(endpoint, url, True, 200, data=data)
