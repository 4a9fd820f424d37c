"""The workbench's front door: every HTTP request passes here before any route runs.

In order:

1. **Host.** The Host header must name this workbench (``ARBOR_ALLOWED_HOSTS``; localhost names
   by default). A page on another site that rebinds its domain to 127.0.0.1 sends its own
   name and is refused, so loopback stays private to the machine's own users.
2. **Who asks.** Open without sign-in: ``OPEN_PATHS`` (the bare health probe, the sign-in page,
   static files) and nothing else, so a route added later is closed by default. Everything else
   needs one of: ``Authorization: Bearer <operator token>`` (API clients, the CLI), or ``x-api-key:
   <operator token>`` (langgraph-sdk's ``api_key``, agent-chat-ui); the identity
   header of a trusted reverse proxy (``ARBOR_IDENTITY_HEADER``, when configured); the session
   cookie that ``/signin`` sets. Who it is lands in ``request.state.operator`` (approvals record it).
3. **Cross-site requests.** A cookie rides along with requests other sites make, so a request
   signed in by cookie that changes state (any method but GET/HEAD/OPTIONS) must come from this
   origin: a foreign ``Origin`` or ``Sec-Fetch-Site: cross-site`` is a 403. The cookie is also
   ``SameSite=Strict``. Bearer and proxy requests carry no ambient credential and skip this.
4. **JSON bodies.** A body sent to ``/api/`` or ``/langgraph/`` must say ``Content-Type: application/json``: the
   content types a cross-site HTML form can send are refused (415) before anything parses them.

Refusals use the workbench's error body (``{"error": {"message", "type"}}``); a browser asking
for a page without a session is sent to ``/signin`` instead. Pure ASGI, so SSE streams pass
through untouched.
"""

from __future__ import annotations

from collections.abc import Iterable
from urllib.parse import quote

from fastapi.responses import JSONResponse, RedirectResponse

from app.auth.operator_token import OperatorToken
from app.errors import WorkbenchError

SESSION_COOKIE = "arbor_session"
#: paths served without sign-in (exact, or a prefix ending in "/")
OPEN_PATHS = ("/healthz", "/signin", "/static/")
DEFAULT_ALLOWED_HOSTS = ("localhost", "127.0.0.1", "::1")
_SAFE_METHODS = frozenset({"GET", "HEAD", "OPTIONS"})
_BODY_METHODS = frozenset({"POST", "PUT", "PATCH", "DELETE"})
_MAX_IDENTITY_CHARS = 200
_JSON_PREFIXES = ("/api/", "/langgraph/")  # the JSON APIs: the workbench's and the LangGraph Platform subset


def is_open_path(path: str) -> bool:
    return any(path == p or (p.endswith("/") and path.startswith(p)) for p in OPEN_PATHS)


def host_name(host_header: str) -> str:
    """"Example.org:8090" -> "example.org"; "[::1]:8090" -> "::1"."""
    host = host_header.strip().lower()
    if host.startswith("["):
        return host[1:host.find("]")] if "]" in host else host[1:]
    return host.rsplit(":", 1)[0] if host.count(":") == 1 else host


class WorkbenchGuard:
    """ASGI middleware doing the checks of the module doc, in that order."""

    def __init__(self, app, *, token: OperatorToken, allowed_hosts: Iterable[str], identity_header: str = "",
                 session_max_age_s: int = 7 * 24 * 3600):
        self.app = app
        self.token = token
        self.allowed_hosts = frozenset(h.lower() for h in allowed_hosts)
        self.identity_header = identity_header.lower().encode("latin-1")
        self.session_max_age_s = session_max_age_s

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        headers = _headers(scope)
        refusal = self._check(scope, headers)
        if refusal is not None:
            return await refusal(scope, receive, send)
        await self.app(scope, receive, send)

    def _check(self, scope, headers: dict[bytes, str]):
        host = headers.get(b"host", "")
        if "*" not in self.allowed_hosts and host_name(host) not in self.allowed_hosts:
            return _refuse(400, f"Host {host!r} is not a name of this workbench; add its host name to "
                                "ARBOR_ALLOWED_HOSTS (comma-separated) to serve it", "host_not_allowed")
        path, method = scope["path"], scope["method"]
        if is_open_path(path):
            return None
        operator, by_cookie = self._operator(headers)
        if operator is None:
            return self._sign_in_needed(path, method, headers)
        scope.setdefault("state", {})["operator"] = operator
        if by_cookie and method not in _SAFE_METHODS and _cross_site(headers, scope):
            return _refuse(403, "a state-changing request from another site was refused; use the workbench's "
                                "own pages, or an API client with Authorization: Bearer <token>", "cross_site")
        if path.startswith(_JSON_PREFIXES) and method in _BODY_METHODS and _has_body(headers) \
                and not _is_json(headers.get(b"content-type", "")):
            return _refuse(415, "the request body must be JSON, sent with Content-Type: application/json",
                           "unsupported_media_type")
        return None

    def _operator(self, headers: dict[bytes, str]) -> tuple[str | None, bool]:
        """(who asks, whether by cookie); (None, False) when nobody is signed in."""
        authorization = headers.get(b"authorization", "")
        if authorization[:7].lower() == "bearer ":
            return ("operator" if self.token.matches(authorization[7:].strip()) else None), False
        api_key = headers.get(b"x-api-key", "").strip()  # langgraph-sdk's and agent-chat-ui's api_key
        if api_key:
            return ("operator" if self.token.matches(api_key) else None), False
        if self.identity_header:
            identity = headers.get(self.identity_header, "").strip()
            if identity:
                return identity[:_MAX_IDENTITY_CHARS], False
        cookie = _cookie(headers.get(b"cookie", ""), SESSION_COOKIE)
        if cookie and self.token.cookie_is_valid(cookie, self.session_max_age_s):
            return "operator", True
        return None, False

    def _sign_in_needed(self, path: str, method: str, headers: dict[bytes, str]):
        wants_page = method == "GET" and "text/html" in headers.get(b"accept", "") \
            and not path.startswith(("/api/", "/ui/", "/langgraph/"))
        if wants_page:
            return RedirectResponse(f"/signin?next={quote(path, safe='/')}", status_code=303)
        message = "sign in first: send Authorization: Bearer <workbench token> (arbor token prints it)"
        if self.identity_header:
            message += f", or come through the proxy that sets {self.identity_header.decode()}"
        response = _refuse(401, message, "unauthorized")
        response.headers["WWW-Authenticate"] = "Bearer"
        return response


def _headers(scope) -> dict[bytes, str]:
    # latin-1 is how HTTP header bytes map to text; a header repeated keeps its last value
    return {name.lower(): value.decode("latin-1") for name, value in scope.get("headers", ())}


def _cookie(header: str, name: str) -> str | None:
    for part in header.split(";"):
        key, _, value = part.strip().partition("=")
        if key == name:
            return value
    return None


def _cross_site(headers: dict[bytes, str], scope) -> bool:
    if headers.get(b"sec-fetch-site", "") == "cross-site":
        return True
    origin = headers.get(b"origin")
    if origin is None:  # older browsers omit it on same-origin requests; SameSite=Strict covers them
        return False
    scheme = scope.get("scheme", "http")
    return origin.rstrip("/").lower() != f"{scheme}://{headers.get(b'host', '')}".lower()


def _has_body(headers: dict[bytes, str]) -> bool:
    return headers.get(b"content-length", "0").strip() not in ("", "0") or b"transfer-encoding" in headers


def _is_json(content_type: str) -> bool:
    media = content_type.split(";", 1)[0].strip().lower()
    return media == "application/json" or (media.startswith("application/") and media.endswith("+json"))


def _refuse(status: int, message: str, error_type: str) -> JSONResponse:
    return JSONResponse(status_code=status, content=WorkbenchError(message, error_type, status).to_body(),
                        headers={"Cache-Control": "no-store"})
