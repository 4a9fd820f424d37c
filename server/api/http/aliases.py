"""llama-server's unprefixed paths: `/chat/completions`, `/completions`, `/models` and
`/embeddings` are served by their `/v1/...` routes (same handler, same API-key check), so
clients configured with a base URL without `/v1` work unchanged. SGLang's `/flush_cache` is
served by `/cache/flush`, so a router's cache flush reaches every replica.

Done as a path rewrite in front of the router rather than as duplicate routes, so a route
file declares each endpoint once and a new `/v1` route listed here gets its alias for free.
"""

from __future__ import annotations

from starlette.types import ASGIApp, Receive, Scope, Send

ALIASES = {p: "/v1" + p for p in ("/chat/completions", "/completions", "/models", "/embeddings")}
# SGLang's name for emptying the prefix cache: SMG's `POST /flush_cache` fans out to it on every worker.
ALIASES["/flush_cache"] = "/cache/flush"


class UnprefixedAliases:
    """ASGI middleware: rewrite an aliased path to its /v1 route before routing."""

    def __init__(self, app: ASGIApp):
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http":
            target = ALIASES.get(scope["path"].rstrip("/") or "/")
            if target is not None:
                scope = dict(scope, path=target, raw_path=target.encode())
        await self.app(scope, receive, send)
