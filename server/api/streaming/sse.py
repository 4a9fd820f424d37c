"""Server-sent-event frames, as every protocol writes them.

Two shapes: OpenAI's and llama-server's data-only frames (`data: {...}`, `sse`), and the named
frames of the Responses and Messages APIs (`event: <type>` then `data: {...}`, `sse_event`).
JSON is written with `ensure_ascii=False`, so text goes out as the model wrote it.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

from server.api.http.errors import APIError


def sse(data: dict[str, Any] | str) -> str:
    payload = data if isinstance(data, str) else json.dumps(data, ensure_ascii=False)
    return f"data: {payload}\n\n"


def sse_event(kind: str, data: dict[str, Any]) -> str:
    """A named frame: its event type, then its data."""
    return f"event: {kind}\ndata: {json.dumps(data, ensure_ascii=False)}\n\n"


TEXT_SLOT = "\x00"  # stands for the text in a body given to sse_with_text (JSON never emits it raw)


def sse_with_text(body: dict[str, Any]) -> Callable[[str], str]:
    """A renderer of `sse(body)` frames in which the one string value TEXT_SLOT is replaced by
    the given text. A stream's content chunks differ only in their text, so the rest is
    serialized once per stream instead of once per chunk; the frames are byte-identical."""
    head, tail = json.dumps(body, ensure_ascii=False).split(json.dumps(TEXT_SLOT))
    head, tail = "data: " + head, tail + "\n\n"
    return lambda text: head + json.dumps(text, ensure_ascii=False) + tail


def error_event(error: APIError) -> str:
    """An OpenAI-format error inside an already started event stream (the HTTP status is already 200)."""
    return sse(error.body())
