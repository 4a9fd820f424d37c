"""A shared store's URL as it may be shown: the password replaced by `***`.

A Redis/Valkey URL carries its credentials (`redis://user:password@host:6379/0`, or
`?password=` in the query, which redis-py also reads). Every place that prints the URL
(/cache/stats, log lines, error messages, settings errors) prints `redact_url(url)` instead,
so a password never reaches stats, logs or traces.
"""

from __future__ import annotations

from urllib.parse import parse_qs, parse_qsl, unquote, urlencode, urlsplit

MASK = "***"


def redact_url(url: str) -> str:
    """`url` with its password (userinfo or `password=` query parameter) shown as `***`;
    a URL that does not parse is masked whole after its scheme (it might be all secret)."""
    try:
        parts = urlsplit(url)
        netloc = parts.netloc
        if "@" in netloc:
            userinfo, host = netloc.rsplit("@", 1)
            user, sep, _password = userinfo.partition(":")
            # a lone userinfo is a user name to redis-py, but people write passwords there too
            netloc = f"{user}:{MASK}@{host}" if sep else f"{MASK}@{host}"
        query = parts.query
        if query:
            pairs = parse_qsl(query, keep_blank_values=True)
            query = urlencode([(k, MASK if k.lower() == "password" else v) for k, v in pairs], safe="*")
        # by hand: urlunsplit drops the empty authority of unix:///path
        return (f"{parts.scheme}://{netloc}{parts.path}" + (f"?{query}" if query else "")
                + (f"#{parts.fragment}" if parts.fragment else ""))
    except ValueError:
        scheme = url.split("://", 1)[0] if "://" in url else ""
        return f"{scheme}://{MASK}" if scheme else MASK


def password_of(url: str) -> str | None:
    """The password a URL carries (to scrub it from error texts), or None."""
    try:
        parts = urlsplit(url)
        pw = parts.password or parse_qs(parts.query).get("password", [None])[0]
    except ValueError:
        return None
    return unquote(pw) if pw else None
