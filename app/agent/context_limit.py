"""How many tokens one request may hold (prompt + completion), as the model server reports it.

Read once per workbench from the public endpoints servers already have, first answer wins:

1. ``GET /props`` ``default_generation_settings.n_ctx`` (arbor-server, llama-server: the
   context of one request, i.e. of one slot);
2. ``GET /v1/models``, the entry of the model in use: ``max_model_len`` (vLLM, SGLang) or
   ``meta.n_ctx_train`` (llama-server, arbor-server: the model's trained context);
3. the ``LLM_CONTEXT_TOKENS`` setting.

``/props`` lives at the server root, beside ``/v1``. A server that answers but reports no
limit falls through to the next source; one that cannot be reached is asked again on the
next call (the model call itself then reports the outage).
"""

from __future__ import annotations

from dataclasses import dataclass

import httpx


@dataclass(frozen=True)
class ContextLimit:
    n_ctx: int  # tokens one request may hold: prompt + completion
    source: str  # "props" | "models" | "settings"


def server_root(base_url: str) -> str:
    """The server root of an OpenAI base URL (``http://h:p/v1`` -> ``http://h:p``)."""
    base = base_url.rstrip("/")
    return base[: -len("/v1")] if base.endswith("/v1") else base


def _positive_int(value: object) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) and value > 0 else None


def limit_from_props(props: object) -> int | None:
    if not isinstance(props, dict):
        return None
    settings = props.get("default_generation_settings")
    return _positive_int(settings.get("n_ctx")) if isinstance(settings, dict) else None


def limit_from_models(listing: object, model: str | None) -> int | None:
    """`max_model_len` or `meta.n_ctx_train` of `model`'s entry (the first entry if not listed)."""
    entries = listing.get("data") if isinstance(listing, dict) else None
    if not isinstance(entries, list) or not entries:
        return None
    entry = next((e for e in entries if isinstance(e, dict) and e.get("id") == model), entries[0])
    if not isinstance(entry, dict):
        return None
    meta = entry.get("meta")
    if not isinstance(meta, dict):
        meta = {}
    return _positive_int(entry.get("max_model_len")) or _positive_int(meta.get("n_ctx_train"))


class ContextLimitReader:
    """Asks the server once; `get()` returns the cached answer afterwards."""

    def __init__(self, base_url: str, api_key: str, fallback: int | None, timeout_s: float = 10.0) -> None:
        self.base_url = base_url.rstrip("/")
        self.headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
        self.fallback = ContextLimit(fallback, "settings") if fallback else None
        self.timeout_s = timeout_s
        self._known: ContextLimit | None = None
        self._asked = False

    async def get(self, model: str | None) -> ContextLimit | None:
        if self._asked:
            return self._known
        try:
            async with httpx.AsyncClient(timeout=self.timeout_s, headers=self.headers) as http:
                n_ctx = limit_from_props(await self._json(http, f"{server_root(self.base_url)}/props"))
                source = "props"
                if n_ctx is None:
                    n_ctx = limit_from_models(await self._json(http, f"{self.base_url}/models"), model)
                    source = "models"
        except httpx.TransportError:
            return self.fallback  # unreachable now: ask again next time
        self._known = ContextLimit(n_ctx, source) if n_ctx else self.fallback
        self._asked = True
        return self._known

    @staticmethod
    async def _json(http: httpx.AsyncClient, url: str) -> object:
        response = await http.get(url)
        if response.status_code != 200:
            return None
        try:
            return response.json()
        except ValueError:
            return None
