"""Cache lifecycle hints from what really happens in the workbench.

The inference server keeps a session's KV warm or lets it go by the hints it gets
(arbor-server; other servers ignore them). The workbench's session key is one per branch,
``"<session id>/<branch id>"`` (`hint_key`); replay and manifests use the same form.

- a model request carries ``{"state": "active"}`` (the model is called; `model_client`);
- tools running or an approval pending: ``tool_wait`` (graph nodes ``approval``, ``tools``), naming
  what it waits on (``tool``: the tools' names joined by ``+``, or ``approval``), so the server
  times the wait by that tool's earlier ones;
- a turn ends (answer, step budget, failure): ``done``; on the pinned branch ``done`` with
  ``pin: true``, since the user is still looking at it;
- the user opens a branch: it is pinned and the branch pinned before is unpinned, so one
  workbench pins at most one branch;
- a session is deleted: ``done`` for each of its branches (a release);
- the workbench stops: its pinned branch is unpinned.

Hints with no request to ride on go to the server's ``POST /cache/hint``. A hint is advice: a
failure is logged and never fails a turn, and a server without the endpoint (404, 405, 501)
gets no more of them from this workbench.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Iterable

import httpx

log = logging.getLogger(__name__)

#: answers that mean "this server has no hint endpoint" (stock llama-server, vLLM, SGLang)
_UNSUPPORTED = (404, 405, 501)
APPROVAL_WAIT = "approval"  # what a tool wait for an operator's approval names: a person's time, not a tool's
_TIMEOUT_S = 5.0


def hint_key(session_id: str, branch_id: str) -> str:
    """The cache session of a branch: ``"<session id>/<branch id>"``."""
    return f"{session_id}/{branch_id}"


def server_root(llm_base_url: str) -> str:
    """``http://host:8080/v1`` -> ``http://host:8080``: /cache/hint lives at the server's root."""
    return llm_base_url.rstrip("/").removesuffix("/v1")


class CacheHints:
    """Sends the bare hints of one workbench and remembers the branch it pinned."""

    def __init__(self, llm_base_url: str, api_key: str | None = None,
                 client: httpx.AsyncClient | None = None) -> None:
        self.url = server_root(llm_base_url) + "/cache/hint"
        key = api_key if api_key and api_key != "not-needed" else None
        self._headers = {"Authorization": f"Bearer {key}"} if key else {}
        self._client = client or httpx.AsyncClient(timeout=_TIMEOUT_S)
        self._owned = client is None
        self.supported = True  # False once the server said it has no /cache/hint
        self.pinned: str | None = None
        self._pin_lock = asyncio.Lock()  # opening two branches at once must leave one pinned

    async def send(self, key: str, state: str | None = None, pin: bool | None = None, tool: str | None = None) -> bool:
        """POST one hint; True when the server took it. Never raises."""
        if not self.supported:
            return False
        body: dict = {"session": key}
        if state is not None:
            body["state"] = state
        if pin is not None:
            body["pin"] = pin
        if tool is not None:
            body["tool"] = tool
        try:
            response = await self._client.post(self.url, json=body, headers=self._headers)
        except httpx.HTTPError as exc:
            log.info("cache hint %s not sent: %s", body, exc)
            return False
        if response.status_code in _UNSUPPORTED:
            log.info("%s answered HTTP %s: no more cache hints to this server", self.url, response.status_code)
            self.supported = False
            return False
        if response.status_code != 200:
            log.warning("cache hint %s refused: HTTP %s %s", body, response.status_code, response.text[:300])
            return False
        return True

    async def tool_wait(self, key: str, tools: Iterable[str] = ()) -> None:
        """Tools run or an approval is pending: the branch comes back soon. `tools`: what it waits on (the
        tools' names, or APPROVAL), so the server times the wait by that tool's earlier ones."""
        names = sorted(set(tools))
        await self.send(key, "tool_wait", tool="+".join(names)[:256] if names else None)

    async def turn_ended(self, key: str) -> None:
        """A turn finished with nothing more to do; the branch the user looks at stays pinned."""
        await self.send(key, "done", pin=True if key == self.pinned else None)

    async def open_branch(self, key: str) -> None:
        """The user opened this branch: pin it, unpin the one pinned before."""
        async with self._pin_lock:
            previous, self.pinned = self.pinned, key
            if previous is not None and previous != key:
                await self.send(previous, pin=False)
            await self.send(key, pin=True)

    async def release(self, keys: Iterable[str]) -> None:
        """The branches are gone (their session was deleted): ``done`` unpins and frees first."""
        for key in keys:
            if key == self.pinned:
                self.pinned = None
            await self.send(key, "done")

    async def close(self) -> None:
        """Unpin what this workbench pinned, then close the HTTP client."""
        try:
            if self.pinned is not None:
                await self.send(self.pinned, pin=False)
                self.pinned = None
        finally:
            if self._owned:
                await self._client.aclose()
