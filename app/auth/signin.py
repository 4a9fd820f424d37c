"""Sign-in and sign-out for the pages: the operator token in, a session cookie out.

- ``GET /signin`` shows the form; ``GET /signin?token=…`` (the URL ``arbor token`` prints)
  signs in at once, like a notebook server's token link.
- ``POST /signin`` takes the form (``token``, ``next``): a right token sets the cookie and
  sends the browser to ``next``; a wrong one shows the form again with a 401.
- ``POST /signout`` clears the cookie.

The cookie is HttpOnly (no script reads it), SameSite=Strict (no other site's request carries
it), Secure over HTTPS, and expires after ``ARBOR_SESSION_HOURS``.
"""

from __future__ import annotations

from urllib.parse import parse_qs

from fastapi import APIRouter, Request
from fastapi.responses import HTMLResponse, RedirectResponse, Response

from app.auth.guard import SESSION_COOKIE
from frontend.pages import render_page

router = APIRouter(include_in_schema=False)
_MAX_FORM_BYTES = 8192


def safe_next(target: str | None) -> str:
    """A local path to go to after sign-in; anything that could leave the site becomes "/"."""
    if not target or not target.startswith("/") or target.startswith(("//", "/\\")):
        return "/"
    return target


@router.get("/signin", response_class=HTMLResponse)
def signin_page(request: Request, next: str = "/", token: str | None = None) -> Response:
    if token is not None:
        return _sign_in(request, token, safe_next(next))
    return _form(request, safe_next(next), None)


@router.post("/signin")
async def signin(request: Request) -> Response:
    body = await request.body()
    if len(body) > _MAX_FORM_BYTES:
        return _form(request, "/", "The form was too large.", status=413)
    form = parse_qs(body.decode("utf-8", "replace"))
    return _sign_in(request, (form.get("token") or [""])[0], safe_next((form.get("next") or ["/"])[0]))


@router.post("/signout")
def signout() -> Response:
    response = RedirectResponse("/signin", status_code=303)
    response.delete_cookie(SESSION_COOKIE, path="/")
    return response


def _sign_in(request: Request, candidate: str, target: str) -> Response:
    token = request.app.state.operator_token
    if not token.matches(candidate.strip()):
        return _form(request, target, "That token is not this workbench's.", status=401)
    response = RedirectResponse(target, status_code=303)
    response.set_cookie(SESSION_COOKIE, token.session_cookie(), max_age=request.app.state.settings.session_max_age_s,
                        path="/", httponly=True, samesite="strict", secure=request.url.scheme == "https")
    return response


def _form(request: Request, target: str, error: str | None, status: int = 200) -> Response:
    settings = request.app.state.settings
    response = render_page(request, "signin.html", "signin", next=target, error=error,
                           token_file=str(settings.data_dir / "workbench-token"))
    response.status_code = status
    return response
