"""The Host-header check: a request must name this server by a name it was configured with.

Without it, loopback is not private: a page the operator visits can rebind its own domain to
127.0.0.1 and drive the server from the operator's browser, as a same-origin page (the pattern of
Ollama's DNS-rebinding CVE). The browser still sends the page's domain as Host, so refusing
unknown names closes that.

Allowed (`allowed_hosts(settings)`): the localhost names (`localhost`, `127.0.0.1`, `::1`), the
address given to --host when it is a specific one (not 0.0.0.0 / ::), and every --allowed-hosts
entry (`*.example.com` matches its subdomains). `*` allows any Host: for a server behind a proxy
that checks Host itself. Compose's other containers reach the server by its service name
(`http://server:8080`), so compose lists that name in ARBOR_SERVER_ALLOWED_HOSTS.

The matching is Starlette's TrustedHostMiddleware's (a subclass, so its pattern checks apply);
only the answer differs: a refused Host gets a 400 in the OpenAI error format, and a Host that
does not parse (or is missing) counts as refused.
"""

from __future__ import annotations

import ipaddress
import re

from starlette.middleware.trustedhost import TrustedHostMiddleware
from starlette.types import ASGIApp, Receive, Scope, Send

from server.api.http.errors import APIError
from server.settings import ServerSettings

LOCALHOST_NAMES = ("localhost", "127.0.0.1", "::1", "[::1]")
_WILDCARD_BINDS = ("", "0.0.0.0", "::", "[::]")
# host, optionally a port; an IPv6 host in brackets (RFC 9110 Host = uri-host [ ":" port ])
_HOST_HEADER = re.compile(r"(?P<host>\[[0-9A-Fa-f:.]+\]|[^\[\]:/\s]+)(:(?P<port>\d{1,5}))?")


def allowed_hosts(settings: ServerSettings) -> list[str]:
    """The names a Host header may carry, lower case; IPv6 addresses in both forms (bare and in
    brackets), since a Host header brackets them."""
    if "*" in settings.allowed_hosts:
        return ["*"]
    names = [*LOCALHOST_NAMES]
    bound = settings.host.strip().lower()
    if bound not in _WILDCARD_BINDS:
        names.append(bound)
    names.extend(settings.allowed_hosts)
    out: list[str] = []
    for name in names:
        bare = name[1:-1] if name.startswith("[") and name.endswith("]") else name
        forms = [name]
        if ":" in bare:
            try:
                ipaddress.IPv6Address(bare)
                forms = [bare, f"[{bare}]"]
            except ValueError:
                pass
        out.extend(f for f in forms if f not in out)
    return out


def host_of(header: str | None) -> str | None:
    """The host part of a Host header, lower case, without its port; None when it does not parse."""
    if not header:
        return None
    match = _HOST_HEADER.fullmatch(header.strip())
    return match["host"].lower() if match else None


class HostCheck(TrustedHostMiddleware):
    """ASGI middleware: 400 (OpenAI format, code `invalid_host`) unless the Host header names an
    allowed host. Lifespan and other non-HTTP scopes pass."""

    def __init__(self, app: ASGIApp, settings: ServerSettings):
        super().__init__(app, allowed_hosts=allowed_hosts(settings), www_redirect=False)

    def allows(self, host_header: str | None) -> bool:
        if self.allow_any:
            return True
        host = host_of(host_header)
        if host is None:
            return False
        return any(host == p or (p.startswith("*.") and host.endswith(p[1:])) for p in self.allowed_hosts)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":  # the server has no websockets; lifespan passes
            return await self.app(scope, receive, send)
        header = next((v.decode("latin-1") for k, v in scope["headers"] if k == b"host"), None)
        if self.allows(header):
            return await self.app(scope, receive, send)
        shown = (header or "")[:100]
        err = APIError(f"Host header {shown!r} is not a name this server answers to; the operator allows more "
                       "with --allowed-hosts (ARBOR_SERVER_ALLOWED_HOSTS)", code="invalid_host", param="Host")
        await err.response()(scope, receive, send)
