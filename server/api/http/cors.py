"""CORS, so a browser page on another origin can call the server.

Default (no --cors-origins): origins on this machine only (`http(s)://localhost`,
`127.0.0.1`, `[::1]`, any port) are reflected in Access-Control-Allow-Origin; a page
elsewhere on the web gets no CORS headers, so the browser keeps it from reading answers.
`--cors-origins` replaces that with an explicit allow-list ("*" allows every origin).
Credentials (cookies) are never allowed; an API key travels in the Authorization header,
which preflights may request like any other header.
"""

from __future__ import annotations

from fastapi import FastAPI
from fastapi.middleware.cors import CORSMiddleware

LOCALHOST_ORIGINS = r"https?://(localhost|127\.0\.0\.1|\[::1\])(:\d+)?"


def install_cors(app: FastAPI, origins: tuple[str, ...]) -> None:
    app.add_middleware(
        CORSMiddleware,
        allow_origins=list(origins),
        allow_origin_regex=None if origins else LOCALHOST_ORIGINS,
        allow_methods=["GET", "POST", "OPTIONS"],
        allow_headers=["*"],
        expose_headers=["Retry-After"],
        max_age=600,
    )
