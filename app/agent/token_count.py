"""Exact prompt token counts from the model server, where it offers them.

arbor-server and llama-server render a chat request with the model's own template
(``POST /apply-template`` {messages, tools} -> {prompt}) and tokenize text with its own
vocabulary (``POST /tokenize`` {content, add_special, parse_special} -> {tokens}); both live at
the server root beside ``/v1``. Together they count a request's prompt as the server will:
compaction then decides on the real size, not on an estimate (app/agent/context_budget.py).

``add_special`` is asked for: a model that starts prompts with a BOS token gets it counted;
where the template text already begins with it the count is one token high, never low.

A server without these routes (404, 405, 501: vLLM, SGLang, the scripted fake) is not asked
again; the workbench estimates instead (app/agent/token_estimate.py). Any other failure
(an error answer, a timeout) gives no count for that request only.
"""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator, Awaitable, Callable

import httpx

from app.agent.context_limit import server_root

Count = Callable[[list[dict], list[dict] | None], Awaitable[int | None]]
_NOT_OFFERED = (404, 405, 501)


class ServerTokenCounter:
    """One per workbench: remembers whether the server offers counting at all."""

    def __init__(self, base_url: str, api_key: str, timeout_s: float = 10.0) -> None:
        self.root = server_root(base_url)
        self.headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
        self.timeout_s = timeout_s
        self.offered: bool | None = None  # None: not asked yet

    @contextlib.asynccontextmanager
    async def session(self) -> AsyncIterator[Count | None]:
        """A `count(messages, tools)` for one fit (one connection for its several counts), or
        None when the server is known not to count; `count` gives None when it cannot."""
        if self.offered is False:
            yield None
            return
        async with httpx.AsyncClient(timeout=self.timeout_s, headers=self.headers) as http:
            async def count(messages: list[dict], tools: list[dict] | None) -> int | None:
                return await self._count(http, messages, tools)
            yield count

    async def _count(self, http: httpx.AsyncClient, messages: list[dict], tools: list[dict] | None) -> int | None:
        if self.offered is False:
            return None
        try:
            rendered = await http.post(f"{self.root}/apply-template",
                                       json={"messages": messages, **({"tools": tools} if tools else {})})
            if rendered.status_code in _NOT_OFFERED:
                self.offered = False
                return None
            prompt = rendered.json().get("prompt") if rendered.status_code == 200 else None
            if not isinstance(prompt, str):
                return None
            counted = await http.post(f"{self.root}/tokenize",
                                      json={"content": prompt, "add_special": True, "parse_special": True})
            if counted.status_code in _NOT_OFFERED:
                self.offered = False
                return None
            tokens = counted.json().get("tokens") if counted.status_code == 200 else None
        except (httpx.HTTPError, ValueError):
            return None
        if not isinstance(tokens, list):
            return None
        self.offered = True
        return len(tokens)
