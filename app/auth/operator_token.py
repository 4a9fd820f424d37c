"""The operator token: the one secret that signs a person or a program into the workbench.

Where it comes from, first match wins:

1. ``ARBOR_WORKBENCH_TOKEN`` (a compose secret, a systemd credential, a test);
2. ``<data dir>/workbench-token``, written at an earlier start;
3. generated now (32 random bytes, URL-safe), written to that file with mode 0600 and announced
   once on stderr with the URL that signs a browser in.

Rotating it: delete the file (or change the variable) and restart; every session cookie signed
with the old token stops working at once, because the cookie is a MAC keyed by the token.
"""

from __future__ import annotations

import hashlib
import hmac
import os
import secrets
import time
from dataclasses import dataclass
from pathlib import Path

TOKEN_FILE = "workbench-token"
#: shortest token accepted from the environment: a guessable token is no protection
MIN_TOKEN_CHARS = 16
_COOKIE_PURPOSE = b"arbor-workbench-session-v1"


@dataclass(frozen=True)
class OperatorToken:
    """The token and where it came from ("env", "file" or "generated")."""

    value: str
    source: str
    path: Path | None = None

    def matches(self, candidate: str) -> bool:
        """Constant-time comparison; compared as UTF-8 bytes so any header text is safe to pass."""
        return hmac.compare_digest(candidate.encode("utf-8", "surrogatepass"), self.value.encode("utf-8"))

    def session_cookie(self, now: float | None = None) -> str:
        """A session cookie value: its issue time and a MAC of it keyed by the token."""
        issued = str(int(time.time() if now is None else now))
        return f"{issued}.{self._mac(issued)}"

    def cookie_is_valid(self, value: str, max_age_s: int, now: float | None = None) -> bool:
        """True for a cookie this token issued less than `max_age_s` seconds ago."""
        issued, _, mac = value.partition(".")
        if not issued.isdigit() or not mac:
            return False
        age = (time.time() if now is None else now) - int(issued)
        if not 0 <= age < max_age_s:
            return False
        return hmac.compare_digest(mac.encode("ascii", "replace"), self._mac(issued).encode("ascii"))

    def _mac(self, issued: str) -> str:
        key = hashlib.sha256(_COOKIE_PURPOSE + self.value.encode("utf-8")).digest()
        return hmac.new(key, issued.encode("ascii"), hashlib.sha256).hexdigest()


def resolve_token(configured: str | None, data_dir: Path) -> OperatorToken:
    """The operator token for a workbench whose data lives in `data_dir` (see the module doc).

    Raises ValueError when a configured or stored token is shorter than MIN_TOKEN_CHARS.
    """
    if configured:
        return OperatorToken(_checked(configured.strip(), "ARBOR_WORKBENCH_TOKEN"), "env")
    path = data_dir / TOKEN_FILE
    if path.exists():
        return OperatorToken(_checked(path.read_text(encoding="utf-8").strip(), str(path)), "file", path)
    data_dir.mkdir(parents=True, exist_ok=True)
    value = secrets.token_urlsafe(32)
    # O_EXCL: two workbench processes starting at once on one data dir must not both write;
    # the loser reads the winner's token.
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    except FileExistsError:
        return resolve_token(None, data_dir)
    with os.fdopen(fd, "w", encoding="utf-8") as out:
        out.write(value + "\n")
    return OperatorToken(value, "generated", path)


def existing_token(configured: str | None, data_dir: Path) -> str | None:
    """The token a client should present (the variable, else the file), without generating one."""
    if configured:
        return configured.strip()
    path = data_dir / TOKEN_FILE
    return path.read_text(encoding="utf-8").strip() if path.exists() else None


def rotate_token(data_dir: Path) -> OperatorToken:
    """Replace the token file with a new token; the running workbench keeps the old one until it
    restarts (then every cookie and client holding the old one must sign in again)."""
    (data_dir / TOKEN_FILE).unlink(missing_ok=True)
    return resolve_token(None, data_dir)


def _checked(value: str, where: str) -> str:
    if len(value) < MIN_TOKEN_CHARS:
        raise ValueError(f"the workbench token in {where} has {len(value)} characters; use at least "
                         f"{MIN_TOKEN_CHARS} (e.g. python -c 'import secrets; print(secrets.token_urlsafe(32))')")
    return value
