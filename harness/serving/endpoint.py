"""Server addressing shared by the replay parts: base URL normalisation and headers."""

from __future__ import annotations


def server_root(base_url: str) -> str:
    """Accept ``http://host:port`` or the OpenAI-style ``http://host:port/v1``; return the root.

    llama-server style routes (/props, /tokenize, /apply-template) live at the root, the
    OpenAI routes under ``/v1``.
    """
    url = base_url.strip().rstrip("/")
    if not url.startswith(("http://", "https://")):
        raise ValueError(f"base URL must start with http:// or https://, got {base_url!r}")
    if url.endswith("/v1"):
        url = url[: -len("/v1")]
    return url


def auth_headers(api_key: str | None) -> dict[str, str]:
    return {"Authorization": f"Bearer {api_key}"} if api_key else {}

